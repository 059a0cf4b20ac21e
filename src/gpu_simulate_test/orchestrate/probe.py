"""The capacity probe, run for real: an all-at-once burst through the (served) engine, judged by
the rule of :mod:`gpu_simulate_test.core.metrics.capacity_probe`. The fidelity campaign sets its
loads by it; the capacity stage's real search starts its bracket there when no simulated answer is
at hand."""

from __future__ import annotations

import dataclasses
from typing import Any

from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import ArrivalConfig, DurationDistConfig
from gpu_simulate_test.core.metrics.capacity_probe import probe_record, session_capacity
from gpu_simulate_test.core.run_inputs import load_run
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.orchestrate.configs import with_workload
from gpu_simulate_test.orchestrate.steps import make_workload
from gpu_simulate_test.orchestrate.truth import trusted_truth


def probe_size(cfg: PipelineStageConfig, requested: int) -> int:
    """``requested``, or by backend when 0: 16 one-at-a-time requests for hf_generate, else
    max(64, 3 × the batch cap) so the engine runs at its cap for most of the burst."""
    if requested:
        return requested
    if cfg.backend.name == "hf_generate":
        return 16
    return max(64, 3 * cfg.backend.step_limits()[1])


def measure_capacity(
    cfg: PipelineStageConfig, run_id: str, probe_requests: int, reruns: int = 0
) -> dict[str, Any]:
    """Replay an all-at-once burst for real; capacity by :func:`core.capacity_probe.burst_capacity`.
    A burst the real bench marks disturbed (late sends, held-back streams, foreign CPU) is run
    again, ``reruns`` times at most; the record's ``truth`` says what was done
    (:meth:`~gpu_simulate_test.orchestrate.truth.Truth.to_dict`), and the capacity is the last
    attempt's.

    With multi-turn sessions the burst is ``probe_requests`` sessions at once, each turn sent as
    soon as the one before it ended (no think time, so the engine never idles for want of work),
    and the capacity is in sessions/s: :func:`core.capacity_probe.session_capacity`."""
    session = cfg.workload.session
    if session.enabled:
        session = dataclasses.replace(session, think_time=DurationDistConfig("fixed", value_s=0.0))
    probe = with_workload(
        cfg,
        run_id,
        num_requests=probe_requests,
        arrival=ArrivalConfig(process="all_at_once"),
        session=session,
    )
    workload_dir = make_workload(probe)
    truth = trusted_truth(probe, workload_dir, reruns=reruns)
    real_dir = truth.real_dir
    requests = load_run(real_dir, "real_bench").requests
    record = {
        **probe_record(requests, str(real_dir), "see its run_meta.json for the engine"),
        "truth": truth.to_dict(),
    }
    sessions = load_workload(workload_dir).sessions
    if sessions is None:
        return {**record, "probe_requests": probe_requests}
    return session_capacity(record, sessions.num_sessions)
