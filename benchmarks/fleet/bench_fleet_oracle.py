"""A real vLLM data-parallel run replayed as a fleet (the oracle: each simulated engine timed by
its real engine's steps, requests entering when the real engines queued them): how many
requests the ``vllm_dp`` router sends to the replica vLLM's own balancer chose, and how much of
the rest the coordinator's staleness explains (issue 62's target: the same replica for >= 95%
of requests, requests per replica within +-5%).

The balancer decides on counts the coordinator sent at its last 100 ms tick; where that tick
falls against the run's clock is unknown. The replay is repeated with the tick's phase swept
over 0-90 ms, with counts fresh at every decision (a 1 ms tick: no staleness), and with no
counts at all (only the client's own in-flight requests): the spread over phases is what the
staleness's timing alone moves.

Run: ``python -m benchmarks.fleet.bench_fleet_oracle tmp/real_bench/<dp run> [...]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from gpu_simulate_test.config.vidur import VidurSchedulerConfig
from gpu_simulate_test.core.run_inputs import load_run
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.simulator.fleet import ENGINE, run_fleet
from gpu_simulate_test.simulator.routers.vllm_dp import VllmDataParallel
from gpu_simulate_test.vidur_simulate.oracle import FleetOracle
from gpu_simulate_test.vidur_simulate.real_run import run_knobs
from gpu_simulate_test.vidur_simulate.replay import replay_source, v1_params

PHASES_MS = tuple(range(0, 100, 10))
TARGET_SAME = 0.95
TARGET_COUNT_PCT = 5.0


def replay(run_dir: Path, router: VllmDataParallel, at_send: bool = True) -> dict[str, Any]:
    """The run replayed behind ``router``: the same-replica share and requests per replica;
    ``at_send``: the router decides when the client sent each request (as the stage's oracle
    replay does), else when its engine queued it."""
    run = load_run(run_dir, "real_bench")
    workload = load_workload(run.meta["workload_dir"])
    scheduled = workload.intervals["arrival_time_s"].to_numpy(dtype=float)
    source = replay_source(str(run_dir), workload, scheduled)
    assert isinstance(source.clock, FleetOracle) and source.engine_of is not None
    taken = {knob: value for knob, (value, _) in run_knobs(run_dir).items()}
    knobs = dataclasses.replace(VidurSchedulerConfig(), **taken)  # as the stage's oracle replay
    params = v1_params(knobs, knobs.num_blocks)
    assert params is not None
    lengths = workload.lengths.set_index("request_id").reindex(
        workload.intervals["request_id"].to_numpy()
    )
    result = run_fleet(
        params,
        source.clock.clocks,
        router,
        source.engine_arrival_s,
        lengths["num_prefill_tokens"].to_numpy(dtype=np.int64),
        lengths["num_decode_tokens"].to_numpy(dtype=np.int64),
        log_steps=False,
        routed_at=source.client_arrival_s if at_send else None,
    )
    sim = result.requests[ENGINE].to_numpy()
    real = source.engine_of
    known = real >= 0
    engines = len(source.clock.clocks)
    real_counts = np.bincount(real[known], minlength=engines)
    sim_counts = np.bincount(sim[known], minlength=engines)
    gap = 100.0 * np.abs(sim_counts - real_counts) / np.maximum(real_counts, 1)
    return {
        "same": float((sim[known] == real[known]).mean()),
        "real_counts": real_counts.tolist(),
        "sim_counts": sim_counts.tolist(),
        "count_gap_pct": float(gap.max()),
        "requests": int(known.sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", nargs="+", type=Path, help="real_bench runs of a -dp server")
    args = parser.parse_args()
    for run_dir in args.runs:
        engines = len(set(load_run(run_dir, "real_bench").requests[ENGINE].dropna()))
        stage = replay(run_dir, VllmDataParallel(engines))
        phases = [
            replay(run_dir, VllmDataParallel(engines, phase_s=ms / 1000.0))["same"]
            for ms in PHASES_MS
        ]
        fresh = replay(run_dir, VllmDataParallel(engines, tick_s=0.001))["same"]
        blind = replay(run_dir, VllmDataParallel(engines, tick_s=1e9, idle_tick_s=1e9))["same"]
        queued = replay(run_dir, VllmDataParallel(engines), at_send=False)
        print(f"\n{run_dir} ({stage['requests']} requests, {engines} engines)")
        print(
            f"  requests per replica: real {stage['real_counts']}, simulated "
            f"{stage['sim_counts']} (largest gap {stage['count_gap_pct']:.1f}%)"
        )
        print(f"  same replica (decided at the send, tick phase 0): {100 * stage['same']:.1f}%")
        print(
            f"  over tick phases 0-90 ms: min {100 * min(phases):.1f}%, median "
            f"{100 * statistics.median(phases):.1f}%, max {100 * max(phases):.1f}%"
        )
        print(f"  counts fresh at every decision (1 ms tick): {100 * fresh:.1f}%")
        print(f"  no counts (the client's in-flight requests only): {100 * blind:.1f}%")
        print(
            f"  decided when the engine queued it instead: {100 * queued['same']:.1f}% "
            f"(per replica {queued['sim_counts']})"
        )
        met = stage["same"] >= TARGET_SAME and stage["count_gap_pct"] <= TARGET_COUNT_PCT
        print(
            f"  target (>= {100 * TARGET_SAME:.0f}% same, counts within "
            f"{TARGET_COUNT_PCT:.0f}%): {'met' if met else 'NOT met'}"
        )


if __name__ == "__main__":
    main()
