"""Every stage's typed config, built from an orchestrator's pipeline config: written once for
``pipeline``, ``fidelity`` and ``capacity``.

The stage runs land in ``<cfg.output.root>/<stage>/<cfg.output.run_id>/``: an orchestrator
chooses where with :func:`at_run` (or :func:`with_workload`) before it calls a step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_simulate_test.config.backends import own_knobs
from gpu_simulate_test.config.compare import CompareStageConfig
from gpu_simulate_test.config.fleet import FleetConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.schema import OutputConfig, WorkloadStageConfig, nested_output
from gpu_simulate_test.config.vidur import (
    EngineCalibrationConfig,
    VidurConfig,
    VidurSchedulerConfig,
    VidurSimulateStageConfig,
)
from gpu_simulate_test.io.artifacts import ArtifactError, as_stored_json


def as_resolved(cfg: Any) -> dict[str, Any]:
    """A stage's typed config as the resolved config its run records (``run_meta.json``)."""
    return dict(as_stored_json(dataclasses.asdict(cfg)))


def recorded_pipeline(recorded: Mapping[str, Any], where: Path) -> PipelineStageConfig:
    """The pipeline config a real phase recorded (``as_resolved``), typed again; ``where`` (the
    file it came from) names it in the error when it no longer validates."""
    from omegaconf import OmegaConf

    from gpu_simulate_test.config.registry import to_typed

    recorded = dict(recorded)
    # a real phase older than the settings clean-up stored ``stage`` (removed, never read) and
    # ``vidur.fast_path`` (renamed): both dead, since the simulating run's ``vidur`` replaces it
    recorded.pop("stage", None)
    # and its ``vidur.scheduler`` (the simulating run derives its own, checked against the one
    # the real phase recorded apart): an older default there is no knob set twice
    dead = ("fast_path", "scheduler")
    recorded["vidur"] = {k: v for k, v in (recorded.get("vidur") or {}).items() if k not in dead}
    # one recorded before each engine had its own config class held every engine's knobs
    if isinstance(recorded.get("backend"), Mapping):
        recorded["backend"] = own_knobs(recorded["backend"])
    try:
        return to_typed(OmegaConf.create(recorded), PipelineStageConfig)
    except ValueError as exc:
        raise ArtifactError(f"{where}: the recorded config does not validate: {exc}") from exc


def at_run(
    cfg: PipelineStageConfig, run_id: str, overwrite: bool | None = None
) -> PipelineStageConfig:
    """``cfg`` whose stage runs take the id ``run_id`` (and ``overwrite`` when given)."""
    output = dataclasses.replace(
        cfg.output,
        run_id=run_id,
        overwrite=cfg.output.overwrite if overwrite is None else overwrite,
    )
    return dataclasses.replace(cfg, output=output)


def nested_in(cfg: PipelineStageConfig, root: Path | str | None) -> PipelineStageConfig:
    """``cfg`` whose stage runs land under ``root`` (``<root>/<stage>/<run_id>/``, inside an
    orchestrator's own run directory), sharing the outer engines' snapshots and caches; ``cfg``
    itself without a ``root``."""
    if root is None:
        return cfg
    output = dataclasses.replace(nested_output(cfg.output, root), run_id=cfg.output.run_id)
    return dataclasses.replace(cfg, output=output)


def with_workload(cfg: PipelineStageConfig, run_id: str, **workload: Any) -> PipelineStageConfig:
    """``cfg`` with other workload fields and run id, allowed to replace a run of that id (for
    the orchestrators, fidelity and capacity, that own the directory their stage runs go in)."""
    cfg = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, **workload))
    return at_run(cfg, run_id, overwrite=True)


def stage_output(cfg: PipelineStageConfig) -> OutputConfig:
    """Where each stage run of ``cfg`` lands: a copy of its ``output``, every field kept."""
    return dataclasses.replace(cfg.output)


def workload_config(cfg: PipelineStageConfig) -> WorkloadStageConfig:
    return WorkloadStageConfig(
        model=cfg.model, workload=cfg.workload, output=stage_output(cfg), progress=cfg.progress
    )


def real_bench_config(cfg: PipelineStageConfig, workload_dir: Path | str) -> RealBenchStageConfig:
    """The real bench of ``cfg.backend`` (at a served engine when :mod:`.serving` pointed
    ``cfg`` at one) on the workload in ``workload_dir``."""
    return RealBenchStageConfig(
        model=cfg.model,
        hardware=cfg.hardware,
        backend=cfg.backend,
        workload_dir=str(workload_dir),
        dtype=cfg.dtype,
        attn_implementation=cfg.attn_implementation,
        num_warmup_requests=cfg.num_warmup_requests,
        goodput=cfg.goodput,
        output=stage_output(cfg),
        progress=cfg.progress,
    )


def engine_calibration(cfg: PipelineStageConfig) -> EngineCalibrationConfig:
    """How the profile stage calibrates ``cfg``'s backend (its knobs and attention)."""
    return EngineCalibrationConfig(
        enable=cfg.engine_overhead,
        backend=cfg.backend,
        attn_implementation=cfg.attn_implementation,
        beside_neighbours=cfg.calibrate_beside_neighbours,
    )


def simulation_vidur(cfg: PipelineStageConfig, scheduler: VidurSchedulerConfig) -> VidurConfig:
    """The simulator's config: derived scheduler knobs, and the engine overhead when calibrated."""
    overhead = cfg.backend.name if cfg.engine_overhead else cfg.vidur.engine_overhead
    return dataclasses.replace(cfg.vidur, scheduler=scheduler, engine_overhead=overhead)


def simulate_config(
    cfg: PipelineStageConfig,
    scheduler: VidurSchedulerConfig,
    workload_dir: Path | str,
    arrivals_from: Path | str | None = None,
) -> VidurSimulateStageConfig:
    """Vidur on ``workload_dir`` with ``scheduler``, the bundle under ``cfg.profiling_root``,
    and the arrivals a real run actually sent when ``arrivals_from`` names it; a truth of
    ``backend.data_parallel_size`` engines is simulated as that many replicas behind vLLM's own
    balancer (``fleet.router=vllm_dp``), a truth of ``backend.servers`` servers as that many
    behind the client's router (``backend.router``)."""
    servers = int(getattr(cfg.backend, "servers", 1))
    if servers > 1:
        b = cfg.backend
        fleet = FleetConfig(servers, str(b.router), float(b.router_poll_s))  # type: ignore[attr-defined]
    else:
        fleet = FleetConfig(replicas=int(getattr(cfg.backend, "data_parallel_size", 1)))
    return VidurSimulateStageConfig(
        model=cfg.model,
        hardware=cfg.hardware,
        vidur=simulation_vidur(cfg, scheduler),
        workload_dir=str(workload_dir),
        profiling_root=cfg.profiling_root,
        arrivals_from=None if arrivals_from is None else str(arrivals_from),
        goodput=cfg.goodput,
        output=stage_output(cfg),
        progress=cfg.progress,
        fleet=fleet,
    )


def compare_config(
    cfg: PipelineStageConfig,
    real_dir: Path | str,
    sim_dir: Path | str,
    repeat_dir: Path | str | None = None,
    replaced: tuple[Path, ...] = (),
) -> CompareStageConfig:
    return CompareStageConfig(
        real_run_dir=str(real_dir),
        sim_run_dir=str(sim_dir),
        real_repeat_dir=None if repeat_dir is None else str(repeat_dir),
        replaced_runs=tuple(str(path) for path in replaced),
        compare=cfg.compare,
        goodput=cfg.goodput,
        output=stage_output(cfg),
        progress=cfg.progress,
    )
