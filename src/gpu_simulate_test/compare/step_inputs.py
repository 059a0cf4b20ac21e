"""The engine steps of both runs, read for the comparison: the step logs and their comparison
(:mod:`.steps`), the step sequences and their step-by-step alignment (:mod:`.alignment`), and
for a fleet each engine's alignment."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.record import SimulatedCalibration
from gpu_simulate_test.compare.alignment import StepAlignment, align
from gpu_simulate_test.compare.clocks import ENGINE_COLUMNS, sim_engine_metric
from gpu_simulate_test.compare.comparison import Comparison
from gpu_simulate_test.compare.metrics import JoinedRequests
from gpu_simulate_test.compare.steps import StepComparison, compare_steps
from gpu_simulate_test.core.run_inputs import RunInput
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv
from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE, ENGINE_STEP_LOG, FLEET_COLUMN

ENGINE = FLEET_COLUMN.name
Steps = tuple[pd.DataFrame, pd.DataFrame, StepComparison]
"""Both runs' step logs and their comparison."""
Aligned = tuple[pd.DataFrame, pd.DataFrame, StepAlignment]
"""Both runs' step sequences and their step-by-step alignment."""


def load_steps(
    real: RunInput, sim: RunInput, comparison: Comparison, used: SimulatedCalibration
) -> Steps | None:
    """Both runs' engine steps and their comparison; None unless both runs have a step log
    (a vLLM run, and a simulation from this version on)."""
    real_path, sim_path = real.path / layout.ENGINE_STEP_LOG, sim.path / layout.ENGINE_STEP_LOG
    if not (real_path.is_file() and sim_path.is_file()):
        return None
    real_steps = read_csv(real_path, ENGINE_STEP_LOG)
    sim_steps = read_csv(sim_path, ENGINE_STEP_LOG)
    engine_log = real.meta.get("engine_log") or {}
    queue = queued_ms(real.requests, sim.requests, comparison.joined.request_id) or {
        "real": engine_log.get("mean_server_queue_time_ms"),
        "sim": _mean_ms(comparison.joined.sim.scheduling_delay_s),
        "source": "the server's own count",
    }
    joined = comparison.joined
    ttft = {
        "client": float(np.nanmean(joined.real.ttft_s) * 1000),
        "server": engine_log.get("mean_server_ttft_ms"),
        "sim": float(np.nanmean(joined.sim.ttft_s) * 1000),
        **engine_ttft_ms(real.requests, sim.requests, joined),
    }
    if (frontend_ms := used.frontend_ttft_ms) is not None:
        ttft["sim_frontend"] = frontend_ms
    return real_steps, sim_steps, compare_steps(real_steps, sim_steps, queue, ttft)


def engine_ttft_ms(
    real: pd.DataFrame, sim: pd.DataFrame, joined: JoinedRequests
) -> dict[str, float]:
    """Mean TTFT on each side's engine clock over the joined requests (ms): ``engine``, the
    real engine's own (``engine_ttft_s``), and ``sim_engine``, the simulation's without the
    front end it added (:func:`~.clocks.sim_engine_metric`). Client minus engine is then the
    front end on both sides, the same span (the API server's own TTFT metric starts inside
    the front end and is not it). Empty without the real engine's clock."""
    column = ENGINE_COLUMNS["ttft"]
    if column not in real.columns:
        return {}
    frame = real.set_index("request_id").reindex(joined.request_id)
    engine = _mean_ms(pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float))
    if engine is None:
        return {}
    sim_engine = _mean_ms(sim_engine_metric(sim, joined, "ttft"))
    return {"engine": engine} | ({} if sim_engine is None else {"sim_engine": sim_engine})


def _mean_ms(values: np.ndarray) -> float | None:
    return float(np.nanmean(values) * 1000) if np.isfinite(values).any() else None


def queued_ms(
    real: pd.DataFrame, sim: pd.DataFrame, ids: np.ndarray
) -> dict[str, float | str | None] | None:
    """Mean time queued before the first step over the requests ``ids``, per request on both
    sides (``request_metrics``), from the engine's queued stamp (``engine_scheduling_delay_s``):
    vLLM queues a request between steps, so the wait for a running step is not in it, and the
    simulation's column leaves it out too. None unless both sides have it."""
    column = "engine_scheduling_delay_s"
    if column not in real.columns or column not in sim.columns:
        return None
    side = [
        pd.to_numeric(frame.set_index("request_id").reindex(ids)[column], errors="coerce")
        for frame in (real, sim)
    ]
    values = [_mean_ms(s.to_numpy(dtype=float)) for s in side]
    if values[0] is None or values[1] is None:
        return None
    return {"real": values[0], "sim": values[1], "source": "per request, as the engine queued it"}


def load_alignment(
    real: RunInput, sim: RunInput
) -> tuple[Aligned | None, list[dict[str, Any]] | None]:
    """Both step sequences and their step-by-step alignment: the recorded schedules where both
    runs have one, else both step logs; None without steps on either side. A fleet's steps
    (an ``engine`` column on both sides) are aligned engine by engine: the alignment returned
    first is engine 0's, and the second item holds each engine's (None for one engine)."""
    pairs = (
        (layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE),
        (layout.ENGINE_STEP_LOG, ENGINE_STEP_LOG),
    )
    for name, schema in pairs:
        if (real.path / name).is_file() and (sim.path / name).is_file():
            real_seq = read_csv(real.path / name, schema)
            sim_seq = read_csv(sim.path / name, schema)
            arrivals = _engine_arrivals(real)
            if ENGINE not in real_seq.columns or ENGINE not in sim_seq.columns:
                return (real_seq, sim_seq, align(real_seq, sim_seq, arrivals)), None
            engines = int(max(real_seq[ENGINE].max(), sim_seq[ENGINE].max()) + 1)
            per_engine = [(_engine(real_seq, k), _engine(sim_seq, k)) for k in range(engines)]
            alignments = [align(r, s, arrivals) for r, s in per_engine]
            first = (*per_engine[0], alignments[0])
            return first, [{"engine": k, **a.to_dict()} for k, a in enumerate(alignments)]
    return None, None


def _engine(steps: pd.DataFrame, k: int) -> pd.DataFrame:
    return steps[steps[ENGINE] == k].reset_index(drop=True)


def _engine_arrivals(real: RunInput) -> dict[str, float] | None:
    if "engine_arrival_time_s" not in real.requests:
        return None
    known = real.requests.dropna(subset=["engine_arrival_time_s"])
    return dict(
        zip(
            known["request_id"].astype(int).astype(str),
            known["engine_arrival_time_s"].astype(float),
            strict=True,
        )
    )
