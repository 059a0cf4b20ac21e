"""``tune.recalibrate``: when the servers the tune checked all ran off its calibration on one
side, calibrate once more and simulate the space again.

A bundle's calibration times the host at one moment; a tune reuses it for hours or days. On the
project's 2-core CPU host the same steps ran 20% faster ten minutes after a calibration than
during it (benchmarks/results/tune_20261128b), and six hours after another calibration every
checked server ran 11-21% slower than it (the capacities simulated 15-100% high). The checked
servers say so (:func:`~.verify.calibration_speed`: every one more than 8% off on the same
side). Then the tune calibrates again, once, on a fresh server of its own (the whole profile and
calibration into ``recalibration/`` of the run, the shared bundle left as it was), measures the
checked servers' steps against the new step model (their recorded steps: no server runs again),
and adopts the new calibration when those servers' pooled level is closer to 1 with it. Adopted,
the space is simulated again with it and that is the tune's answer (ranking, best, table); the
first calibration's capacities stay in ``verify.configs[*].first_calibration_qps`` and
``recalibration``. The checked servers choose between two calibrations; neither was fitted on
them (a benchmark judges on other servers: ``benchmarks/bench_tune.py``'s grid).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_simulate_test.calibration.level import Predict
from gpu_simulate_test.capacity.real_search import RealSearch
from gpu_simulate_test.capacity.search import Point
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.tune import TuneStageConfig
from gpu_simulate_test.core.reporting import console, progress_bar
from gpu_simulate_test.io.runs import Run
from gpu_simulate_test.tune.calibrations import calibrated_at
from gpu_simulate_test.tune.report import recalibration_sentence
from gpu_simulate_test.tune.simulate import (
    Simulated,
    TuneInputs,
    at_step_level,
    simulate_space,
    simulator_at,
    step_model,
)
from gpu_simulate_test.tune.space import Candidate
from gpu_simulate_test.tune.verify import calibration_speed, checked_row, server_level

RECAL_DIR = "recalibration"
"""The second calibration's own runs (its workload, its server's log) and its bundle
(``recalibration/profiles/<hardware>/<model>``), under the tune's run directory."""
RECAL_POINTS = "recalibrated"
"""Under the points: the space simulated again with the second calibration."""


@dataclass(frozen=True)
class Recalibrated:
    """The second calibration's outcome: the record for ``tune.json`` and, when adopted, the
    inputs and results the tune answers with."""

    record: dict[str, Any]
    tuned: TuneInputs | None = None
    results: list[Simulated] | None = None
    shared: float | None = None


ALWAYS = "tune.recalibrate=always"
"""The reason recorded when the tune calibrates again because it was told to."""


def wanted(cfg: TuneStageConfig, verified: dict[str, Any] | None) -> str:
    """Why the tune calibrates again (the calibration-speed note, or :data:`ALWAYS`), or empty
    when it does not (``off``, nothing checked, or ``auto`` without a note)."""
    if cfg.tune.recalibrate == "off" or not verified:
        return ""
    speed = verified.get("calibration_speed") or {}
    if speed.get("note"):
        return str(speed["note"])
    return ALWAYS if cfg.tune.recalibrate == "always" else ""


def recalibrate(
    cfg: TuneStageConfig,
    r: Run,
    inner_cal: PipelineStageConfig,
    tuned: TuneInputs,
    found: list[Candidate],
    first_results: list[Simulated],
    verified: dict[str, Any],
    searches: dict[str, RealSearch],
    why: str,
) -> Recalibrated:
    """The second calibration (``inner_cal``: the pipeline config the first was made with),
    the checked servers' levels against it, and, adopted, the space simulated with it
    (``first_results``: the space simulated with the first, kept in the record). When the
    second calibration fails (a server that does not start, a profile still disturbed after its
    re-timing), the first is kept and the failure recorded: the checks already run are not lost
    to it."""
    started = time.perf_counter()
    if cfg.progress:
        because = why if why == ALWAYS else "the checked servers ran off the calibration"
        console.rule(f"[bold]calibrating again: {because}")
    first = verified.get("calibration_speed") or {}
    try:
        again, results, shared, levels = second_calibration(
            cfg, r, inner_cal, tuned, found, searches
        )
    except Exception as exc:  # any failure of the second try keeps the first
        failed = {
            "reason": why,
            "bundle": None,
            "first": first,
            "second": None,
            "adopted": False,
            "error": f"{type(exc).__name__}: {exc}",
            "wall_time_s": round(time.perf_counter() - started, 1),
        }
        if cfg.progress:
            console.print(f"[yellow]{recalibration_sentence(failed)}")
        return Recalibrated(failed)
    second = calibration_speed(
        [{"server_step_level": level} for level in levels.values() if level is not None]
    )
    adopted = closer(first, second)
    record = {
        "reason": why,
        "bundle": again.inner.profiling_root,
        "first": first,
        "second": second,
        "adopted": adopted,
        "levels": levels,
        "first_capacities_qps": {s.candidate.config_id: s.capacity for s in first_results},
        "capacities_qps": {s.candidate.config_id: s.capacity for s in results},
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
    if cfg.progress:
        console.print(recalibration_sentence(record))
    if not adopted:
        return Recalibrated(record)
    return Recalibrated(record, again, results, shared)


def second_calibration(
    cfg: TuneStageConfig,
    r: Run,
    inner_cal: PipelineStageConfig,
    tuned: TuneInputs,
    found: list[Candidate],
    searches: dict[str, RealSearch],
) -> tuple[TuneInputs, list[Simulated], float | None, dict[str, dict[str, Any] | None]]:
    """The profile and calibration again into ``recalibration/`` of the run, the space simulated
    with it (its inputs, results and shared rate), and each checked server's level against it
    over the same judged runs the first level read."""
    root = r.file(RECAL_DIR)
    _, again = calibrated_at(
        cfg, r, inner_cal, tuned, root, str(root / "profiles"), tuned.points_dir / RECAL_POINTS
    )
    with progress_bar("simulating again with it", len(found), cfg.progress) as advance:
        results, shared = simulate_space(again, found, advance)
    by_id = {s.candidate.config_id: s for s in results}
    model_of = step_model(again)
    levels = {}
    for config_id, search in searches.items():
        sim = by_id.get(config_id)
        if sim is not None and sim.capacity is not None:
            levels[config_id] = server_level(model_of(sim), search)
    return again, results, shared, levels


def closer(first: dict[str, Any], second: dict[str, Any] | None) -> bool:
    """Whether the checked servers' pooled level is nearer 1 with the second calibration."""
    if not second or not first:
        return False
    return abs(float(second["pooled_level"]) - 1.0) < abs(float(first["pooled_level"]) - 1.0)


def adopt_rows(
    cfg: TuneStageConfig,
    verified: dict[str, Any],
    again: Recalibrated,
    searches: dict[str, RealSearch],
    simulate_at: Callable[[Simulated, list[float]], tuple[Point, ...]],
    model: Callable[[Simulated], tuple[Predict, Any] | None] | None = None,
    at_level: Callable[[Simulated, float], Simulated] | None = None,
) -> None:
    """Each checked row built again from its real search with the adopted calibration's
    simulation (:func:`~.verify.checked_row`: the capacity, the ratio and bracket, the latency
    agreement, the server's level and the capacity at it; ``simulate_at``, ``model`` and
    ``at_level`` are the adopted calibration's), the first calibration's capacity and level kept
    (``first_calibration_qps``, ``first_calibration_step_level``); the rows reordered by the new
    simulated capacity. A row without its search or a new capacity is left as it was."""
    assert again.results is not None
    by_id = {s.candidate.config_id: s for s in again.results}
    rows = []
    for old in verified["configs"]:
        sim, found = by_id.get(old["config_id"]), searches.get(old["config_id"])
        if sim is None or sim.answer is None or sim.capacity is None or found is None:
            rows.append(old)
            continue
        new = checked_row(cfg, sim, found, simulate_at, model, at_level)
        new["first_calibration_qps"] = old["simulated_qps"]
        new["first_calibration_step_level"] = old.get("server_step_level")
        rows.append(new)
    rows.sort(key=lambda row: -(row["simulated_qps"] or -1.0))
    verified["configs"] = rows


def adopted_models(
    again: Recalibrated,
) -> tuple[
    Callable[[Simulated, list[float]], tuple[Point, ...]],
    Callable[[Simulated], tuple[Predict, Any] | None],
    Callable[[Simulated, float], Simulated],
]:
    """The adopted calibration's simulation at given rates, step model and at-level search (for
    :func:`adopt_rows`)."""
    assert again.tuned is not None
    return simulator_at(again.tuned), step_model(again.tuned), at_step_level(again.tuned)
