"""A simulation at its real run's own step level: the model's error apart from the host's speed.

The simulation runs at the speed its calibration saw; the real run it is compared with may have
run its steps faster or slower (fresh servers on this host differ by about 15%, and near the
knee a few percent of step time move latency many times over). :func:`real_step_level` times
the real run's own steps (``engine_schedule.csv``) with the simulation's step model
(:func:`~gpu_simulate_test.calibration.level.step_level`, as the tune's check reads its
servers); :func:`at_real_step_level` simulates the same arrivals again with every step that much
longer (``vidur.step_time_scale``; on the host's CPU its front end too,
:mod:`~gpu_simulate_test.calibration.frontend_scale`) and compares. Against the truth, the
simulation as calibrated says how far the answer is off; at the real run's level, how far the
model is off once the host's speed is known. The second reads the judged run, so it is a
diagnosis, never the answer.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.vidur import VidurSchedulerConfig
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv
from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE
from gpu_simulate_test.orchestrate.configs import at_run, nested_in, simulate_config
from gpu_simulate_test.orchestrate.steps import QUIET, Stages, simulate_and_compare
from gpu_simulate_test.simulator.types import NAME as V1_NAME

AT_LEVEL_SUFFIX = "-at-level"
"""The run id of a load simulated at its real run's step level: the load's, with this after."""


def real_step_level(
    cfg: PipelineStageConfig,
    scheduler: VidurSchedulerConfig,
    workload_dir: Path | str,
    real_dir: Path | str,
    model_dir: Path,
) -> dict[str, Any] | None:
    """The real run's busy steps against the step model the simulation of ``cfg`` times them
    with (``ratio``: measured over modelled; ``steps``; ``per_run``); None without the run's
    ``engine_schedule.csv``, a step model (a scheduler other than ``vllm_v1``) or enough busy
    steps. ``model_dir``: where the model is built (Vidur's predictor files)."""
    from gpu_simulate_test.calibration.level import step_level
    from gpu_simulate_test.vidur_simulate.stage import prepare, step_model_of

    path = Path(real_dir) / layout.ENGINE_SCHEDULE  # a started vLLM server's, with its clock
    if not path.is_file():
        return None
    sim_cfg = simulate_config(cfg, scheduler, workload_dir, arrivals_from=real_dir)
    if int(sim_cfg.fleet.replicas) > 1:  # a fleet's steps interleave engines: no one level
        return None
    if sim_cfg.vidur.scheduler.name != V1_NAME:  # Vidur's own schedulers: no step model
        return None
    inputs = prepare(sim_cfg)
    model_dir.mkdir(parents=True, exist_ok=True)
    model = step_model_of(sim_cfg, inputs, model_dir)
    if model is None:
        return None
    return step_level([run_schedule(Path(real_dir))], model.step_s, model.serving)


def run_schedule(real_dir: Path) -> pd.DataFrame:
    """A real run's ``engine_schedule`` with the client's sends beside its steps (each step's
    sends and how far into it they fell, as the calibration replays record them), so that the
    step model times each step with the intake of the sends that fell in it: the level is then
    the steps' speed alone, not the intake counted once in the level and again in the
    simulation. Without the run's request table, the steps alone."""
    from gpu_simulate_test.calibration.serving_replay import with_sends

    schedule = read_csv(real_dir / layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE)
    requests = real_dir / layout.REQUEST_METRICS
    if not requests.is_file():
        return schedule
    sent = pd.read_csv(requests, usecols=["arrival_time_s"])["arrival_time_s"].to_numpy(float)
    return with_sends(schedule, np.sort(sent[np.isfinite(sent)]))


def at_real_step_level(
    cfg: PipelineStageConfig,
    scheduler: VidurSchedulerConfig,
    workload_dir: Path | str,
    real_dir: Path | str,
    run_id: str,
) -> tuple[dict[str, Any] | None, Path | None]:
    """The real run's step level (:func:`real_step_level`) and the comparison of the arrivals
    it sent simulated at that level (run id ``<run_id>-at-level``, under ``cfg.output``);
    (None, None) where the run has no level."""
    at = at_run(cfg, run_id + AT_LEVEL_SUFFIX, overwrite=True)
    leveled = at_level_config(at, scheduler, workload_dir, real_dir)
    if leveled is None:
        return None, None
    level, at = leveled
    _, compare_dir = simulate_and_compare(at, scheduler, workload_dir, real_dir)
    return level, compare_dir


def at_level_config(
    at: PipelineStageConfig,
    scheduler: VidurSchedulerConfig,
    workload_dir: Path | str,
    real_dir: Path | str,
) -> tuple[dict[str, Any], PipelineStageConfig] | None:
    """The real run's step level (:func:`real_step_level`, its model built under
    ``<at's root>/step_models/<at's run id>``) and ``at`` with every step's time times it
    (``vidur.step_time_scale``), and, where the engine runs on the host's CPU, the front end
    too (``vidur.frontend_time_scale``; the level's ``front_end``: whether it did); None where
    the run has no level."""
    from gpu_simulate_test.calibration.frontend_scale import at_level

    model_dir = Path(at.output.root) / "step_models" / str(at.output.run_id)
    level = real_step_level(at, scheduler, workload_dir, real_dir, model_dir)
    if level is None:
        return None
    vidur, front_end = at_level(at.vidur, at.hardware.device, float(level["ratio"]))
    return {**level, "front_end": front_end}, dataclasses.replace(at, vidur=vidur)


def simulate_at_level(
    cfg: PipelineStageConfig,
    scheduler: VidurSchedulerConfig,
    workload_dir: Path | str,
    real_dir: Path | str,
    root: Path | None = None,
    stages: Stages = QUIET,
) -> tuple[dict[str, Any] | None, Path | None]:
    """The real run's step level (:func:`real_step_level`) and the arrivals it sent simulated at
    that level, without a comparison (run id ``<run_id>-at-level``, under ``root`` where given:
    the pipeline's own runs); (None, None) where the run has no level (no step record, a
    scheduler other than ``vllm_v1``, a fleet, too few busy steps)."""
    from gpu_simulate_test.vidur_simulate.stage import run as simulate_run

    at = nested_in(at_run(cfg, f"{cfg.output.run_id}{AT_LEVEL_SUFFIX}"), root)
    leveled = at_level_config(at, scheduler, workload_dir, real_dir)
    if leveled is None:
        return None, None
    level, at = leveled
    sim_cfg = simulate_config(at, scheduler, workload_dir, arrivals_from=real_dir)
    return level, stages.run("vidur_simulate_at_level", simulate_run, sim_cfg)
