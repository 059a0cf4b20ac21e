"""``capacity.verify=search``: the same search on the real engine, so that the predicted capacity
can be set beside the measured one.

One served engine for the whole search; per rate, the workload's first
``capacity.verify_requests`` requests (the same seed, its arrivals scaled to the rate, as the
simulated search scales them) replayed by the real bench, re-run while the real bench marks it
disturbed (up to :data:`RERUNS` times, the truth's rule), and judged by the same goals on the same
(client) clock; the same grid, then the same bisection (:func:`.search.search`).

A multi-turn workload's rate is sessions/s, and ``capacity.verify_requests`` counts sessions
(``workload.num_requests`` does); only a backend that runs sessions' closed loop can replay it
(:func:`check_real_sessions`, before anything starts).
"""

from __future__ import annotations

import time
from typing import Any

from gpu_simulate_test.capacity.search import (
    Answer,
    Point,
    binding,
    judged_point,
    latency_agreement,
    search,
)
from gpu_simulate_test.capacity.sessions import rate_unit
from gpu_simulate_test.config.capacity import CapacityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.core.reporting import console, progress_bar
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.io.runs import Run
from gpu_simulate_test.orchestrate.configs import with_workload
from gpu_simulate_test.orchestrate.serving import check_sessions_served, served
from gpu_simulate_test.orchestrate.steps import make_workload
from gpu_simulate_test.orchestrate.truth import trusted_truth

RERUNS = 2
"""Re-runs of a rate the real bench marked disturbed."""
LONGEST_RATE_S = 90.0
"""The grid is not extended below ``qps_min`` to a rate whose requests would take longer than
this to send."""


def check_real_sessions(cfg: CapacityStageConfig) -> None:
    """``capacity.verify`` replays the workload on the real engine: a multi-turn one needs a
    backend that runs its sessions' closed loop; ConfigError, one line naming the workload and
    ``capacity.verify``, before anything runs (a single-turn workload passes)."""
    inner = cfg.pipeline()
    try:
        check_sessions_served(inner)
    except (ArtifactError, ConfigError):  # a trace that cannot be read says so itself
        raise
    except ValueError as exc:  # the backend runs no sessions
        workload = inner.workload
        named = (
            f"workload.trace_file={workload.trace_file}"
            if workload.source == "trace"
            else "workload.session.enabled=true"
        )
        raise ConfigError(
            f"capacity.verify={cfg.capacity.verify} replays the multi-turn workload ({named}) on "
            f"the real engine, but {exc}; capacity.verify=false searches it by simulation alone"
        ) from exc


def real_search(
    cfg: CapacityStageConfig, inner: PipelineStageConfig, r: Run
) -> tuple[Answer, list[dict[str, Any]], float]:
    """The grid and bisection on the real engine: its answer, each real run, the wall time."""
    from gpu_simulate_test.core.run_inputs import load_run
    from gpu_simulate_test.core.workloads import load_workload

    opts = cfg.capacity
    started = time.perf_counter()
    count = opts.verify_requests  # sessions, for a multi-turn workload
    base = with_workload(inner, "search-base", qps=opts.qps_min, num_requests=count)
    runs: list[dict[str, Any]] = []
    if cfg.progress:
        console.rule(f"[bold]the same search on the real engine ({inner.backend.name})")
    base_dir = make_workload(base)
    unit = rate_unit(load_workload(base_dir).sessions)
    with served(base, r.path, r, base_dir, "the real search") as at_server:
        total = opts.points + opts.refine + opts.extend
        with progress_bar("real rates", total, cfg.progress) as advance:

            def evaluate(qps: float, phase: str) -> Point:
                t0 = time.perf_counter()
                run_id = f"search-{qps:g}"
                at = with_workload(at_server, run_id, qps=qps, num_requests=count)
                truth = trusted_truth(at, make_workload(at), run_id=run_id, reruns=RERUNS)
                requests = load_run(truth.real_dir, "real_bench").requests
                wall = time.perf_counter() - t0
                point = judged_point(qps, phase, requests, opts.slo, wall)
                runs.append(
                    {
                        "qps": qps,
                        "real_run": str(truth.real_dir),
                        "meets_slo": point.meets,
                        "truth": truth.describe(),
                        "disturbed": truth.disturbed,
                    }
                )
                advance(1)
                return point

            answer = search(
                evaluate,
                opts.qps_min,
                opts.qps_max,
                opts.points,
                opts.refine,
                opts.extend,
                opts.verify_stop_after,
                affordable=lambda qps: count / qps <= LONGEST_RATE_S,
                unit=unit,
            )
    return answer, runs, time.perf_counter() - started


def search_record(
    predicted: Answer,
    measured: Answer,
    runs: list[dict[str, Any]],
    wall_s: float,
    count: int,
    keys: tuple[str, ...] = (),
) -> dict[str, Any]:
    """``capacity.json`` ``verify`` of a real search: the measured capacity beside the answer."""
    ratio = (
        predicted.qps / measured.qps
        if predicted.qps is not None and measured.qps is not None
        else None
    )
    return {
        "mode": "search",
        "answer_qps": predicted.qps,
        "measured_capacity_qps": measured.qps,
        "ratio": ratio,
        "measured_bracket_qps": list(measured.bracket),
        "binding": {"simulated": binding(predicted), "real": binding(measured)},
        "note": measured.note,
        "latency_agreement": latency_agreement(predicted, measured, keys),
        "requests_per_rate": count,
        "disturbed_rates": [run["qps"] for run in runs if run["disturbed"]],
        "wall_time_s": round(wall_s, 1),
        "runs": runs,
    }
