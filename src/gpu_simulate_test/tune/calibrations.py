"""``tune.calibrations``: the space simulated with several calibrations, each made on a fresh
server, and the tune answering with the median one.

One calibration is one sample of the host's speed. On the project's 2-core CPU host, four fresh
calibrations made back to back put one configuration's simulated capacity 7–13% apart (CV), and
their common offset against the real grids ranged −18% to +2% (benchmarks/results/
tune_errors_20261128): the answer moved with the calibration's server more than with anything
the tune chose. With ``tune.calibrations=K`` the tune makes K bundles (the first where
``profiling_root`` says, the others beside it in ``<profiling_root>/calibrations/<i>``, reused
by a later tune as the first is), simulates the space with each, and keeps the **median
calibration**: the one whose capacities, over the configurations every calibration can answer,
have the middle geometric mean (the lower of the two middle ones for an even K: the cautious
one). Everything after (the ranking, the check on real servers, a second calibration) runs on
it, so one configuration's answer, its latencies and its step model come from one bundle. The
others stay in ``tune.json`` ``calibrations``: each one's capacity per configuration and the
spread, the simulation's own noise beside the answer.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_simulate_test.capacity.seeds import spread
from gpu_simulate_test.capacity.split import bundle_and_workload
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import nested_output
from gpu_simulate_test.config.tune import TuneStageConfig
from gpu_simulate_test.core.reporting import console, progress_bar
from gpu_simulate_test.io.runs import Run
from gpu_simulate_test.tune.rank import score
from gpu_simulate_test.tune.report import calibrations_sentence
from gpu_simulate_test.tune.simulate import Simulated, TuneInputs, simulate_space
from gpu_simulate_test.tune.space import Candidate

ENSEMBLE_DIR = "calibrations"
"""Beside the first bundle (``<profiling_root>/calibrations/<i>``), in the run directory (each
extra calibration's own runs and server log) and under the points (its simulations)."""


@dataclass(frozen=True)
class Calibration:
    """One of the K calibrations: the pipeline config it was made with (its bundle in
    ``profiling_root``) and the simulation inputs that use it."""

    index: int
    """1 for the first (``profiling_root``), 2.. for the others."""
    inner_cal: PipelineStageConfig
    tuned: TuneInputs


@dataclass(frozen=True)
class Chosen:
    """The median calibration, the space simulated with it, and the record of all K."""

    calibration: Calibration
    results: list[Simulated]
    shared: float | None
    record: dict[str, Any]
    simulated_s: float
    """Seconds the other calibrations' simulations took."""


def bundle_root(profiling_root: str, index: int) -> str:
    """Where the ``index``-th calibration's bundle lives (the first: ``profiling_root``)."""
    if index == 1:
        return profiling_root
    return str(Path(profiling_root) / ENSEMBLE_DIR / str(index))


def calibrated_at(
    cfg: TuneStageConfig,
    r: Run,
    inner_cal: PipelineStageConfig,
    tuned: TuneInputs,
    logs: Path,
    profiling_root: str,
    points_dir: Path,
) -> tuple[PipelineStageConfig, TuneInputs]:
    """A bundle at ``profiling_root`` (profiled and calibrated on a server of its own, its runs
    and server log in ``logs``, where it is missing; reused where it is there), the pipeline
    config it was made with, and the tune's inputs that simulate with it (their points in
    ``points_dir``): each extra calibration's, and ``tune.recalibrate``'s second one."""
    logs.mkdir(parents=True, exist_ok=True)
    at = dataclasses.replace(
        inner_cal, output=nested_output(inner_cal.output, logs), profiling_root=profiling_root
    )
    at, _, _ = bundle_and_workload(
        dataclasses.replace(cfg.as_capacity(), backend=inner_cal.backend), at, r, log_dir=logs
    )
    uses = dataclasses.replace(
        tuned,
        inner=dataclasses.replace(tuned.inner, profiling_root=at.profiling_root),
        points_dir=points_dir,
        models={},  # this calibration's step models, not the first's
    )
    return at, uses


def others(
    cfg: TuneStageConfig, r: Run, inner_cal: PipelineStageConfig, tuned: TuneInputs
) -> list[Calibration]:
    """The calibrations after the first (``tune.calibrations`` - 1), each profiled and
    calibrated on a server of its own where its bundle is missing (reused where it is there);
    none when ``tune.calibrations`` is 1. Made before anything else runs: a calibration times
    the host, and nothing else may share it then."""
    made = []
    for index in range(2, cfg.tune.calibrations + 1):
        if cfg.progress:
            console.rule(f"[bold]calibration {index} of {cfg.tune.calibrations}")
        at, uses = calibrated_at(
            cfg,
            r,
            inner_cal,
            tuned,
            r.file(ENSEMBLE_DIR) / str(index),
            bundle_root(inner_cal.profiling_root, index),
            tuned.points_dir / ENSEMBLE_DIR / str(index),
        )
        made.append(Calibration(index, at, uses))
    return made


def level(results: list[Simulated], objective: str, common: list[str]) -> float:
    """A calibration's level: the geometric mean of its scores over ``common``."""
    by_id = {s.candidate.config_id: score(s, objective) for s in results}
    return math.exp(statistics.fmean(math.log(by_id[c]) for c in common))


def median_index(levels: list[float]) -> int:
    """The position of the median level (the lower middle one for an even count)."""
    order = sorted(range(len(levels)), key=lambda i: levels[i])
    return order[(len(order) - 1) // 2]


def choose(
    cfg: TuneStageConfig,
    first: Calibration,
    first_results: list[Simulated],
    first_shared: float | None,
    rest: list[Calibration],
    found: list[Candidate],
) -> Chosen:
    """The space simulated with each of ``rest`` (``first`` already was), and the median
    calibration among all (:func:`level` over the configurations each one answers). When no
    configuration is answered by all, the first is kept and the record says so."""
    started = time.perf_counter()
    objective = cfg.tune.objective
    runs: list[tuple[Calibration, list[Simulated], float | None]] = [
        (first, first_results, first_shared)
    ]
    with progress_bar(
        f"simulating with the other {len(rest)} calibrations", len(rest) * len(found), cfg.progress
    ) as advance:
        for calibration in rest:
            results, shared = simulate_space(calibration.tuned, found, advance)
            runs.append((calibration, results, shared))
    spent = time.perf_counter() - started
    by_run = [{s.candidate.config_id: score(s, objective) for s in res} for _, res, _ in runs]
    common = [c.config_id for c in found if all(scores[c.config_id] > 0 for scores in by_run)]
    levels = [level(res, objective, common) for _, res, _ in runs] if common else []
    at = median_index(levels) if levels else 0
    calibration, results, shared = runs[at]
    record = ensemble_record(runs, levels, at, objective, common)
    if cfg.progress:
        console.print(calibrations_sentence(record))
    return Chosen(calibration, results, shared, record, spent)


def ensemble_record(
    runs: list[tuple[Calibration, list[Simulated], float | None]],
    levels: list[float],
    at: int,
    objective: str,
    common: list[str],
) -> dict[str, Any]:
    """``tune.json`` ``calibrations``: each calibration's bundle, level (against the chosen one)
    and score per configuration; which answers; per configuration the spread of its score over
    them (max / min − 1)."""
    scores: dict[str, list[float | None]] = {}
    for _, results, _ in runs:
        for s in results:
            value = score(s, objective)
            scores.setdefault(s.candidate.config_id, []).append(value if value > 0 else None)
    spreads = {c: spread([v for v in values if v is not None]) for c, values in scores.items()}
    chosen_level = levels[at] if levels else None
    return {
        "count": len(runs),
        "chosen": runs[at][0].index,
        "objective": objective,
        "bundles": [c.inner_cal.profiling_root for c, _, _ in runs],
        "levels": [round(v / chosen_level, 4) for v in levels] if chosen_level else None,
        "judged_on": common,
        "scores": scores,
        "spread": spreads,
    }
