"""A fleet of engines behind a router (:mod:`gpu_simulate_test.simulator.fleet`): the
``vllm_dp`` router decides as vLLM's own client code does on the same events; one engine is
``run_v1``; engines behind a fixed split take the steps each takes alone on its share."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_simulate_test.simulator.engine import VllmV1Engine
from gpu_simulate_test.simulator.fleet import ENGINE, run_fleet
from gpu_simulate_test.simulator.routers import ROUTERS
from gpu_simulate_test.simulator.routers.vllm_dp import VllmDataParallel
from gpu_simulate_test.simulator.run import run_v1
from tests.unit.simulator.test_simulator_library import PARAMS, TokenClock

Arrays = tuple[np.ndarray, np.ndarray, np.ndarray]
"""Arrival times, prompt and output tokens, per request."""


def _workload(n: int = 40, seed: int = 0, gap_s: float = 0.004) -> Arrays:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(gap_s, n))
    return arrivals, rng.integers(8, 80, n), rng.integers(2, 30, n)


@pytest.mark.parametrize("clients", [1, 2])
def test_vllm_dp_chooses_as_vllms_own_client(clients: int) -> None:
    """vLLM 0.32's ``DPLBAsyncMPClient.get_core_engine_for_request`` and its output handler,
    run in process on a stub of the client's state, and our router, on one random sequence of
    coordinator messages, requests and finishes: the same engine every time, the same client
    state after every event (the harness of ``benchmarks/fleet/bench_router_equivalence``,
    which counts it over 72,000 events)."""
    from benchmarks.fleet.bench_router_equivalence import compare

    tally = compare(engines=3, clients=clients, events=600, seed=7)
    assert tally.routes > 200 and tally.equal == tally.routes
    assert tally.states_equal == tally.events == 600
    assert tally.engines_used == 3  # the sequence exercised every engine


def test_one_engine_is_run_v1() -> None:
    w = _workload()
    alone = run_v1(PARAMS, TokenClock(), *w)
    fleet = run_fleet(PARAMS, [TokenClock()], ROUTERS["vllm_dp"](1, 0), *w)
    assert (fleet.requests[ENGINE] == 0).all()
    assert fleet.requests.drop(columns=[ENGINE]).equals(alone.requests)
    assert fleet.schedule.drop(columns=[ENGINE]).equals(alone.schedule)


@pytest.mark.parametrize("router", ["round_robin", "random", "least_outstanding", "vllm_dp"])
def test_each_engine_takes_the_steps_it_takes_alone_on_its_share(router: str) -> None:
    """Whatever the split, an engine serves its share as it would alone: the request book is
    shared, nothing else."""
    w = _workload(n=60, seed=3, gap_s=0.002)
    fleet = run_fleet(PARAMS, [TokenClock(), TokenClock()], ROUTERS[router](2, 5), *w)
    engine_of = fleet.requests[ENGINE].to_numpy()
    assert set(engine_of) == {0, 1}
    for k in (0, 1):
        share = np.flatnonzero(engine_of == k)
        alone = run_v1(PARAMS, TokenClock(), *(a[share] for a in w))
        mine = fleet.requests.iloc[share].drop(columns=[ENGINE]).reset_index(drop=True)
        columns = ["request_e2e_time", "prefill_e2e_time", "request_scheduling_delay"]
        assert np.array_equal(mine[columns].to_numpy(), alone.requests[columns].to_numpy())
        steps = fleet.schedule[fleet.schedule[ENGINE] == k].drop(columns=[ENGINE, "requests"])
        assert steps.reset_index(drop=True).equals(alone.schedule.drop(columns=["requests"]))


def test_a_burst_spreads_round_robin_under_vllm_dp() -> None:
    """Requests sent at one instant: the client's exact in-flight floor spreads them in turn."""
    n = 8
    w = (np.zeros(n), np.full(n, 16), np.full(n, 4))
    fleet = run_fleet(PARAMS, [TokenClock() for _ in range(4)], ROUTERS["vllm_dp"](4, 0), *w)
    assert fleet.requests[ENGINE].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]


def test_least_outstanding_avoids_the_engine_with_long_requests() -> None:
    """Two long requests first (one per engine), then short ones: as the long one on engine 0
    finishes first, the short ones go to engine 0 while engine 1's long one is in flight."""
    w = (
        np.array([0.0, 0.0, 0.3, 0.31, 0.32]),
        np.array([16, 16, 8, 8, 8]),
        np.array([20, 200, 4, 4, 4]),
    )
    fleet = run_fleet(PARAMS, [TokenClock(), TokenClock()], ROUTERS["least_outstanding"](2, 0), *w)
    assert fleet.requests[ENGINE].tolist()[:2] == [0, 1]
    assert fleet.requests[ENGINE].tolist()[2:] == [0, 0, 0]


class ScriptedFleet:
    """Published counts that change at given times (engine 0 only)."""

    def __init__(self, changes: list[tuple[float, tuple[int, int, float]]]) -> None:
        self.changes = changes
        self.engines: list[VllmV1Engine] = []

    def published(self, engine: int, at: float) -> tuple[int, int, float]:
        counts = (0, 0, 0.0)
        for when, value in self.changes:
            if engine == 0 and when <= at:
                counts = value
        return counts

    def prompt_blocks(self, r: int) -> list[int]:
        return []


def test_vllm_dp_sees_counts_only_as_the_coordinator_sends_them() -> None:
    """Counts published at 0.03 s reach the client at the coordinator's 0.1 s tick; until then
    the client routes on its own raises."""
    router = VllmDataParallel(2)
    fleet = ScriptedFleet([(0.03, (5, 3, 0.9))])
    assert router.route(0, 0.05, fleet) == 0  # the message of tick 0: all zero
    assert router.lb_engines[0] == [1, 0, 0.0]  # its own raise
    assert router.route(1, 0.12, fleet) == 1  # tick 1 sent engine 0's 5 waiting, 3 running
    assert router.lb_engines[0] == [5, 3, 0.9]
    assert router.route(2, 0.15, fleet) == 1  # engine 0 still far busier


@pytest.mark.parametrize("router", ["round_robin", "least_outstanding", "random", "vllm_dp"])
@pytest.mark.parametrize("closed", [False, True])
def test_a_fleet_takes_stretches_where_its_router_reads_no_live_state(
    router: str, closed: bool
) -> None:
    """Behind a router that reads its own counts and what engines publish (when their counts
    change, as vLLM's engines do), engines take stretches of decode steps between sends: the
    same requests, steps and cache totals as one step at a time (a closed loop steps one at a
    time: a follower is routed before any step after its send)."""
    from tests.unit.simulator.test_decode_stretch import DrawClock, StretchingDrawClock, _case

    for seed in range(4):
        case = _case(seed, caching=seed % 2 == 0, closed=closed)
        params = case.pop("params")
        arrays = (case.pop("arrived_at"), case.pop("prefill_tokens"), case.pop("decode_tokens"))
        runs = [
            run_fleet(params, [clock(seed + k) for k in range(3)], ROUTERS[router](3, seed),
                      *arrays, **case)
            for clock in (DrawClock, StretchingDrawClock)
        ]  # fmt: skip
        assert runs[1].requests.equals(runs[0].requests)
        assert runs[1].schedule.equals(runs[0].schedule)
        assert runs[1].preemptions == runs[0].preemptions
        assert runs[1].prefix_cache == runs[0].prefix_cache


def test_a_router_can_decide_before_the_engine_queues_the_request() -> None:
    """``routed_at``: the router decides at the send, the engine still queues the request at its
    arrival. Decided at the arrival, the result is the plain run's; decided 20 ms earlier, a
    request that finished in between still counts as in flight (engine 0 busy: engine 1)."""
    w = (np.array([0.0, 0.030]), np.array([16, 16]), np.array([4, 4]))
    clocks = [TokenClock(), TokenClock()]
    plain = run_fleet(PARAMS, clocks, ROUTERS["least_outstanding"](2, 0), *w)
    same = run_fleet(
        PARAMS, [TokenClock(), TokenClock()], ROUTERS["least_outstanding"](2, 0), *w,
        routed_at=w[0],
    )  # fmt: skip
    assert same.requests.equals(plain.requests)
    done_0 = float(plain.requests["request_e2e_time"].iloc[0])
    assert done_0 < 0.030 and plain.requests[ENGINE].tolist() == [0, 0]
    early = run_fleet(
        PARAMS, [TokenClock(), TokenClock()], ROUTERS["least_outstanding"](2, 0), *w,
        routed_at=np.array([0.0, done_0 / 2]),
    )  # fmt: skip
    assert early.requests[ENGINE].tolist() == [0, 1]
    # the engine queued it at its arrival, not at the decision
    assert early.requests["request_scheduling_delay"].iloc[1] >= 0
    assert early.schedule[early.schedule[ENGINE] == 1]["start_time_s"].min() >= 0.030


@pytest.mark.parametrize("stretches", [False, True])
def test_a_fleet_engine_pauses_before_the_step_that_takes_a_routed_request_in(
    stretches: bool,
) -> None:
    """A request routed to a busy engine after its next step was asked for (a fleet routes each
    send when it is due) still gets the pause before a step that takes one in: engine 0's
    second step starts 1 ms after its first ends, not 0.1 ms (the clock's other pause)."""
    from tests.unit.calibration.test_serving_load import Pausing, PausingStretches

    clock = PausingStretches if stretches else Pausing
    arrivals = (np.array([0.0, 0.001, 0.005]), np.array([16, 16, 16]), np.array([4, 4, 4]))
    result = run_fleet(PARAMS, [clock(0.01), clock(0.01)], ROUTERS["round_robin"](2, 0), *arrivals)
    assert result.requests[ENGINE].tolist() == [0, 1, 0]
    zero = result.schedule[result.schedule[ENGINE] == 0]
    start, end = zero["start_time_s"].to_numpy(), zero["end_time_s"].to_numpy()
    assert start[1] - end[0] == pytest.approx(1e-3)  # takes request 2 in
    assert start[2] - end[1] == pytest.approx(1e-4)  # takes none
    one = run_v1(PARAMS, clock(0.01), *(a[[0, 2]] for a in arrivals))
    assert one.schedule["start_time_s"].tolist() == pytest.approx(start.tolist())
