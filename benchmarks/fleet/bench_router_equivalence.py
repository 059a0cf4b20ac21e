"""The ``vllm_dp`` router against vLLM 0.32's own balancer, decision for decision (issue 62's
target: 100% of decisions equal over at least 10,000 events).

vLLM's ``DPLBAsyncMPClient.get_core_engine_for_request`` and its output handler
(``process_engine_outputs``, which drops finished requests from the client's in-flight counts)
run in process on a stub of the client's state; our
:class:`~gpu_simulate_test.simulator.routers.vllm_dp.VllmDataParallel` gets the same random
sequence of coordinator messages (waiting, running, KV usage per engine: the stale counts the
client holds), requests and finishes. Every route is compared, and after every event the counts
each holds (the local raise included). Swept over engine counts and API-server counts (a
client's start index and ``client_count`` weight).

Run: ``python -m benchmarks.fleet.bench_router_equivalence [--events 12000] [--seed 0]``.
"""

from __future__ import annotations

import argparse
import asyncio
from collections import Counter
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from gpu_simulate_test.simulator.routers.vllm_dp import VllmDataParallel

TARGET_EVENTS = 10_000


@dataclass
class Tally:
    events: int = 0
    routes: int = 0
    equal: int = 0
    states_equal: int = 0
    engines_used: int = 0


def compare(engines: int, clients: int, events: int, seed: int) -> Tally:
    """One random event sequence through vLLM's client code and ours; what agreed."""
    from vllm.v1.engine.core_client import DPLBAsyncMPClient

    client_index = 1 if clients > 1 else 0
    identities = [rank.to_bytes(2, "little") for rank in range(engines)]
    client = SimpleNamespace(
        client_count=clients, reqs_in_flight={}, engine_inflight=Counter(),
        core_engines=identities, lb_engines=[[0, 0, 0.0] for _ in identities],
        eng_start_index=(engines * client_index) // clients,
    )  # fmt: skip
    ours = VllmDataParallel(engines, client_count=clients, client_index=client_index)
    rng = np.random.default_rng(seed)
    in_flight: list[tuple[str, int]] = []
    tally, used = Tally(), set()
    for event in range(events):
        kind = rng.choice(["counts", "route", "finish"], p=[0.15, 0.55, 0.3])
        if kind == "counts":
            counts = [
                [int(rng.integers(0, 8)), int(rng.integers(0, 8)), float(rng.uniform(0, 1))]
                for _ in range(engines)
            ]
            client.lb_engines = [list(c) for c in counts]
            ours.receive(counts)
        elif kind == "route":
            request = SimpleNamespace(
                request_id=f"r{event}", data_parallel_rank=None, pooling_params=None
            )
            theirs = identities.index(
                DPLBAsyncMPClient.get_core_engine_for_request(client, request)  # type: ignore[arg-type]
            )
            mine = ours.choose()
            tally.routes += 1
            tally.equal += int(mine == theirs)
            in_flight.append((request.request_id, theirs))
            used.add(theirs)
        elif in_flight:
            rid, engine = in_flight.pop(int(rng.integers(len(in_flight))))
            outputs = SimpleNamespace(finished_requests=[rid])
            asyncio.run(DPLBAsyncMPClient.process_engine_outputs(client, outputs))  # type: ignore[arg-type]
            ours.finished(0, engine, 0.0)
        tally.events += 1
        tally.states_equal += int(ours.lb_engines == client.lb_engines)
    tally.engines_used = len(used)
    return tally


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=12_000, help="per configuration")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    total = Tally()
    print("engines  api servers  events  routes  equal  states equal  engines used")
    for engines in (2, 4, 8):
        for clients in (1, 2):
            t = compare(engines, clients, args.events, args.seed + 10 * engines + clients)
            print(
                f"{engines:7d}  {clients:11d}  {t.events:6d}  {t.routes:6d}  {t.equal:5d}  "
                f"{t.states_equal:12d}  {t.engines_used:12d}"
            )
            total.events += t.events
            total.routes += t.routes
            total.equal += t.equal
            total.states_equal += t.states_equal
    share = total.equal / total.routes if total.routes else float("nan")
    print(
        f"\nall: {total.events} events, {total.routes} routes, {total.equal} equal "
        f"({100 * share:.2f}%), client state equal after {total.states_equal} of "
        f"{total.events} events"
    )
    ok = total.equal == total.routes and total.events >= TARGET_EVENTS
    print(f"target (100% over >= {TARGET_EVENTS} events): {'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
