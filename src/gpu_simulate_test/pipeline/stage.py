"""The pipeline: workload → vidur_profile (reused when it fits) → real_bench → vidur_simulate
(of the arrivals the real run actually sent) → compare, in one process, each stage's typed config
built from the pipeline's.

Every stage lands in ``<output.root>/<stage>/<run_id>/`` with the same run id; the pipeline's
own run (``<output.root>/pipeline/<run_id>/run_meta.json``) lists them and the time each took.
Before any stage runs, :func:`check_outputs_free` refuses when one of those directories exists
(unless ``output.overwrite``), so a refusal leaves no half-finished pipeline behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from gpu_simulate_test.config.compare import CompareStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.real_bench import BackendConfig, RealBenchStageConfig
from gpu_simulate_test.config.schema import OutputConfig, WorkloadStageConfig
from gpu_simulate_test.config.vidur import (
    EngineCalibrationConfig,
    ProfileRangesConfig,
    VidurConfig,
    VidurProfileStageConfig,
    VidurSchedulerConfig,
    VidurSimulateStageConfig,
)
from gpu_simulate_test.core.bundle import Bundle, BundleRanges, load_bundle
from gpu_simulate_test.core.knobs import derive_scheduler
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, as_stored_json, read_json
from gpu_simulate_test.io.runs import Run, RunExistsError, default_run_id, start_run
from gpu_simulate_test.pipeline.contract import PIPELINE_STAGES
from gpu_simulate_test.vidur_simulate import plan

T = TypeVar("T")


def _dtype_for(requested: str, device: str) -> str:
    """What ``auto`` means for profiling: bf16 on CUDA, fp32 on CPU (as the profiler decides)."""
    if requested != "auto":
        return requested
    return "bfloat16" if device.startswith("cuda") else "float32"


def bundle_misfits(
    cfg: PipelineStageConfig, scheduler: VidurSchedulerConfig, needs: plan.Requirements
) -> list[str]:
    """Why the bundle in ``<profiling_root>/<hardware>/<model>`` is not reusable; empty if it is."""
    path = layout.bundle_dir(cfg.profiling_root, cfg.hardware.name, cfg.model.name)
    if not path.is_dir():
        return [f"no bundle at {path}"]
    try:
        bundle = load_bundle(path, cfg.model)
    except ArtifactError as exc:
        return [str(exc)]
    reasons = []
    disturbed = bundle.meta.get("quality_warnings") or []
    if disturbed and not cfg.accept_profile_warnings:
        reasons.append(
            f"its profile carries {len(disturbed)} quality warning(s) (timings disturbed by a busy "
            "machine; meta.json quality_warnings)"
        )
    if bundle.meta.get("hardware") != cfg.hardware.name:
        reasons.append(f"profiled on {bundle.meta.get('hardware')}, not {cfg.hardware.name}")
    want_dtype = _dtype_for(cfg.profiling.dtype, cfg.hardware.device)
    if bundle.meta.get("dtype") != want_dtype:
        reasons.append(f"profiled in {bundle.meta.get('dtype')}, not {want_dtype}")
    if bundle.ranges.block_size != scheduler.block_size:
        reasons.append(
            f"block_size {bundle.ranges.block_size}, the engine uses {scheduler.block_size}"
        )
    try:
        plan.check_coverage(needs, bundle)
    except ArtifactError as exc:
        reasons.append(str(exc))
    if cfg.engine_overhead:
        reasons += calibration_misfits(cfg, bundle)
    return reasons


def engine_calibration(
    cfg: PipelineStageConfig, backend: BackendConfig | None = None
) -> EngineCalibrationConfig:
    """How the profile stage calibrates the pipeline's backend (its knobs and attention);
    ``backend``: the same engine at the pipeline's own server."""
    return EngineCalibrationConfig(
        enable=cfg.engine_overhead,
        backend=backend or cfg.backend,
        attn_implementation=cfg.attn_implementation,
    )


SERVER_FIELDS: tuple[str, ...] = ("base_url", "served_model_name", "server")
"""Backend fields that say where a server runs, not what engine it is: a calibration made
through one started for the pipeline stands for the same engine started anywhere."""


def engine_identity(backend: Mapping[str, Any]) -> dict[str, Any]:
    """A stored backend config without :data:`SERVER_FIELDS`."""
    return {k: v for k, v in backend.items() if k not in SERVER_FIELDS}


def calibration_misfits(cfg: PipelineStageConfig, bundle: Bundle) -> list[str]:
    """Why the bundle's engine calibration does not stand for ``cfg.backend`` (empty if it does)."""
    from gpu_simulate_test.vidur_profile.engine_steps import CALIBRATION_VERSION

    name = cfg.backend.name
    recorded = bundle.engine_calibration(name)
    if recorded is None or not bundle.engine_steps_path.is_file():
        return [f"no engine calibration for backend {name}"]
    if recorded.get("version") != CALIBRATION_VERSION:
        return [
            f"engine calibration of {name} is version {recorded.get('version')}, this code "
            f"calibrates version {CALIBRATION_VERSION}"
        ]
    if name == "vllm":
        from gpu_simulate_test.core.engines.vllm import vllm_version

        made_on, installed = (recorded.get("engine") or {}).get("vllm_version"), vllm_version()
        if installed and made_on != installed:
            return [f"engine calibration of vllm was made on vLLM {made_on}, this is {installed}"]
    want = as_stored_json(dataclasses.asdict(engine_calibration(cfg)))
    have = dict(recorded.get("settings", {}))
    want["backend"] = engine_identity(want["backend"])
    have["backend"] = engine_identity(have.get("backend") or {})
    differ = sorted(k for k in want if k != "enable" and have.get(k) != want[k])
    if differ:
        return [f"engine calibration of {name} was made with other {', '.join(differ)}"]
    return []


def simulation_vidur(cfg: PipelineStageConfig, scheduler: VidurSchedulerConfig) -> VidurConfig:
    """The simulator's config: derived scheduler knobs, and the engine overhead when calibrated."""
    overhead = cfg.backend.name if cfg.engine_overhead else cfg.vidur.engine_overhead
    return dataclasses.replace(cfg.vidur, scheduler=scheduler, engine_overhead=overhead)


def existing_bundle_ranges(cfg: PipelineStageConfig) -> BundleRanges | None:
    """What the bundle in ``<profiling_root>/<hardware>/<model>`` covers (its context capped at the
    model's); None when there is none or it cannot be read."""
    path = layout.bundle_dir(cfg.profiling_root, cfg.hardware.name, cfg.model.name)
    if not path.is_dir():
        return None
    try:
        ranges = load_bundle(path).ranges
    except ArtifactError:
        return None
    context = min(ranges.max_kv_cache_size, cfg.model.max_position_embeddings)
    return dataclasses.replace(ranges, max_kv_cache_size=context)


def profile_ranges(
    base: ProfileRangesConfig,
    needs: plan.Requirements,
    existing: BundleRanges | None = None,
) -> ProfileRangesConfig:
    """``base`` widened to what the simulation needs and to what ``existing`` (the bundle being
    replaced) covers, so re-profiling never narrows a bundle other runs rely on."""
    keep = existing or BundleRanges(0, 0, 0, 0, 0)
    return dataclasses.replace(
        base,
        max_num_tokens=max(base.max_num_tokens, needs.max_batch_tokens, keep.max_num_tokens),
        max_batch_size=max(base.max_batch_size, needs.max_batch_size, keep.max_batch_size),
        max_prefill_chunk=max(
            base.max_prefill_chunk, needs.max_prefill_chunk, keep.max_prefill_chunk
        ),
        # 0 stands for the model's whole context, which covers any bundle of this model
        max_kv_cache_size=(
            max(base.max_kv_cache_size, needs.max_request_tokens, keep.max_kv_cache_size)
            if base.max_kv_cache_size
            else 0
        ),
    )


def profile_config(
    cfg: PipelineStageConfig,
    scheduler: VidurSchedulerConfig,
    needs: plan.Requirements,
    workload_dir: Path,
    output: OutputConfig,
    progress: bool,
    backend: BackendConfig | None = None,
) -> VidurProfileStageConfig:
    """The vidur_profile config whose bundle covers ``needs`` and at least what the bundle it
    replaces covered.

    ``output.overwrite`` is true so that the bundle is replaced; for the stage's run directory
    that is only safe after :func:`check_outputs_free` (the caller's duty).
    """
    return VidurProfileStageConfig(
        model=cfg.model,
        hardware=cfg.hardware,
        profiling=cfg.profiling,
        profile=profile_ranges(cfg.profile, needs, existing_bundle_ranges(cfg)),
        block_size=scheduler.block_size,
        profiling_root=cfg.profiling_root,
        workload_dir=str(workload_dir),
        engine=engine_calibration(cfg, backend),
        output=dataclasses.replace(output, overwrite=True),
        progress=progress,
    )


@dataclasses.dataclass(frozen=True)
class ProfilePlan:
    """The scheduler the simulation uses, what it needs of the bundle, and why the bundle must be
    profiled again (empty: it is reused)."""

    scheduler: VidurSchedulerConfig
    derived: bool
    """Whether ``scheduler`` was derived from the real backend's knobs."""
    needs: plan.Requirements
    misfits: tuple[str, ...]


def profile_plan(cfg: PipelineStageConfig, prefill: np.ndarray, decode: np.ndarray) -> ProfilePlan:
    """Decide, from the workload's prompt and output lengths, whether the pipeline profiles."""
    scheduler, derived = derive_scheduler(cfg.backend, cfg.vidur.scheduler, int(prefill.max()))
    needs = plan.requirements(prefill, decode, scheduler)
    if not cfg.reuse_profile:
        return ProfilePlan(scheduler, derived, needs, ("reuse_profile=false",))
    return ProfilePlan(scheduler, derived, needs, tuple(bundle_misfits(cfg, scheduler, needs)))


def check_runs_free(paths: Sequence[Path], done: str = "nothing was run") -> None:
    """Raise :class:`RunExistsError` naming every one of ``paths`` that exists already, and
    ``done``: what had run by then."""
    existing = [str(path) for path in paths if path.exists()]
    if existing:
        verb = "exists" if len(existing) == 1 else "exist"
        raise RunExistsError(
            f"{', '.join(existing)} already {verb}; {done} (choose another "
            "output.run_id or pass output.overwrite=true)"
        )


def check_outputs_free(cfg: PipelineStageConfig, run_id: str) -> None:
    """Refuse, before anything is created, when a run directory the pipeline would create
    exists and ``output.overwrite`` is false. ``vidur_profile`` counts only when the pipeline
    will profile (decided on the workload it is about to generate, without writing it)."""
    if cfg.output.overwrite:
        return
    paths = [layout.run_dir(cfg.output.root, stage, run_id) for stage in PIPELINE_STAGES]
    profile_dir = layout.run_dir(cfg.output.root, "vidur_profile", run_id)
    if profile_dir.exists() and cfg.reuse_profile:
        from gpu_simulate_test.core.workloads import generate

        workload, _ = generate(cfg.workload, cfg.model)
        decided = profile_plan(cfg, workload.num_prefill_tokens, workload.num_decode_tokens)
        if not decided.misfits:
            paths.remove(profile_dir)
    check_runs_free(paths)


class RealBenchConfigFn(Protocol):
    """Builds the real bench's config once the workload exists."""

    def __call__(
        self, workload_dir: str, backend: BackendConfig | None = None
    ) -> RealBenchStageConfig: ...


def with_workload(cfg: PipelineStageConfig, run_id: str, **workload: Any) -> PipelineStageConfig:
    """``cfg`` with other workload fields and run id, allowed to replace a run of that id (for
    the orchestrators, fidelity and capacity, that own the directory their stage runs go in)."""
    return dataclasses.replace(
        cfg,
        workload=dataclasses.replace(cfg.workload, **workload),
        output=dataclasses.replace(cfg.output, run_id=run_id, overwrite=True),
    )


def as_resolved(cfg: Any) -> dict[str, Any]:
    """A stage's typed config as the resolved config its run records (``run_meta.json``)."""
    return dict(as_stored_json(dataclasses.asdict(cfg)))


def stage_configs(
    cfg: PipelineStageConfig, run_id: str
) -> tuple[WorkloadStageConfig, RealBenchConfigFn]:
    """The workload stage's config, and the real bench's once the workload exists (at the
    pipeline's own server when ``backend`` is given)."""
    out = OutputConfig(root=cfg.output.root, run_id=run_id, overwrite=cfg.output.overwrite)
    workload = WorkloadStageConfig(
        model=cfg.model, workload=cfg.workload, output=out, progress=cfg.progress
    )

    def real_bench(workload_dir: str, backend: BackendConfig | None = None) -> RealBenchStageConfig:
        return RealBenchStageConfig(
            model=cfg.model,
            hardware=cfg.hardware,
            backend=backend or cfg.backend,
            workload_dir=workload_dir,
            dtype=cfg.dtype,
            attn_implementation=cfg.attn_implementation,
            num_warmup_requests=cfg.num_warmup_requests,
            output=out,
            progress=cfg.progress,
        )

    return workload, real_bench


@contextlib.contextmanager
def shared_server(
    pipeline: Run, real_bench_cfg: RealBenchStageConfig, progress: bool
) -> Iterator[BackendConfig | None]:
    """For a vLLM server the pipeline starts: start one, for the engine calibration and the real
    bench both (a start-up costs about a minute on 2 CPU cores), and yield the backend config
    that points at it (``server.kind=external``, its ``base_url`` and ``log_file``); stop it on
    the way out, whatever happened. Yields None for other backends (each stage does its own)."""
    backend_cfg = real_bench_cfg.backend
    if backend_cfg.name != "vllm" or backend_cfg.server.kind != "vllm":
        yield None
        return
    from gpu_simulate_test.core.engines.vllm import VllmBackend
    from gpu_simulate_test.core.requests import load_requests
    from gpu_simulate_test.core.workloads import load_workload

    backend = VllmBackend(real_bench_cfg)
    backend.check(load_requests(load_workload(real_bench_cfg.workload_dir)))
    backend.log_dir = pipeline.path
    if progress:
        console.print("starting the vLLM server for the calibration and the real bench")
    try:
        backend.start_server()
        pipeline.update_meta(server=backend.describe())
        yield dataclasses.replace(
            backend_cfg,
            base_url=backend.base_url,
            served_model_name=real_bench_cfg.model.name,
            server=dataclasses.replace(
                backend_cfg.server, kind="external", log_file=str(backend.log_path)
            ),
        )
    finally:
        backend.stop_server()


class DisturbedProfileError(ArtifactError):
    """A fresh profile still looks disturbed and ``accept_profile_warnings`` is false."""


def check_profile_quality(cfg: PipelineStageConfig, bundle: Path) -> None:
    """Stop when a fresh profile still carries quality warnings (unless accepted)."""
    if cfg.accept_profile_warnings:
        return
    warnings = read_json(bundle / layout.BUNDLE_META).get("quality_warnings") or []
    if warnings:
        raise DisturbedProfileError(
            f"the profile in {bundle} still looks disturbed after re-timing ({len(warnings)} "
            "finding(s) in meta.json quality_warnings): run again on a quieter machine, or pass "
            "accept_profile_warnings=true to simulate with it"
        )


def _timed(
    pipeline: Run,
    name: str,
    call: Callable[[T, dict[str, Any]], Path],
    stage_cfg: T,
    progress: bool,
) -> Path:
    """Run one stage's library ``run()`` and record where it landed and how long it took."""
    if progress:
        console.rule(f"[bold]{name}")
    started = time.perf_counter()
    path = call(stage_cfg, dataclasses.asdict(stage_cfg))  # type: ignore[call-overload]
    stages = dict(pipeline.meta.get("stages", {}))
    stages[name] = {"path": str(path), "wall_time_s": round(time.perf_counter() - started, 3)}
    pipeline.update_meta(stages=stages)
    return path


def run(cfg: PipelineStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """Run every stage; returns the compare run directory (with ``summary.md``)."""
    from gpu_simulate_test.compare.stage import run as compare_run
    from gpu_simulate_test.core.workloads import load_workload
    from gpu_simulate_test.real_bench.stage import run as real_bench_run
    from gpu_simulate_test.vidur_profile.stage import run as profile_run
    from gpu_simulate_test.vidur_simulate.stage import run as simulate_run
    from gpu_simulate_test.workload.stage import run as workload_run

    run_id = cfg.output.run_id or default_run_id(resolved_config)
    check_outputs_free(cfg, run_id)
    out = OutputConfig(root=cfg.output.root, run_id=run_id, overwrite=cfg.output.overwrite)
    workload_cfg, real_bench_cfg = stage_configs(cfg, run_id)
    with start_run(cfg.output.root, "pipeline", run_id, resolved_config, cfg.output.overwrite) as p:
        workload_dir = _timed(p, "workload", workload_run, workload_cfg, cfg.progress)
        prefill, decode = plan.workload_lengths(load_workload(workload_dir).lengths)
        decided = profile_plan(cfg, prefill, decode)
        scheduler, needs = decided.scheduler, decided.needs
        p.update_meta(
            scheduler=dataclasses.asdict(scheduler),
            scheduler_derived_from=cfg.backend.name if decided.derived else None,
        )

        if decided.misfits and not cfg.output.overwrite:
            # a safety net (the profile stage's overwrite is meant for the bundle):
            # check_outputs_free decided on the same workload before any stage
            check_runs_free(
                [layout.run_dir(cfg.output.root, "vidur_profile", run_id)],
                "the workload stage ran, the pipeline stopped before profiling",
            )
        with shared_server(p, real_bench_cfg(str(workload_dir), None), cfg.progress) as served:
            if decided.misfits:
                if cfg.progress:
                    console.print("profiling, because: " + "; ".join(decided.misfits))
                profile_cfg = profile_config(
                    cfg, scheduler, needs, workload_dir, out, cfg.progress, served
                )
                bundle_path = _timed(p, "vidur_profile", profile_run, profile_cfg, cfg.progress)
                check_profile_quality(cfg, bundle_path)
            else:
                bundle = layout.bundle_dir(cfg.profiling_root, cfg.hardware.name, cfg.model.name)
                p.update_meta(reused_bundle=str(bundle))
                if cfg.progress:
                    console.print(f"reusing the profiling bundle {bundle} (it covers this run)")
            real_dir = _timed(
                p,
                "real_bench",
                real_bench_run,
                real_bench_cfg(str(workload_dir), served),
                cfg.progress,
            )
        simulate_cfg = VidurSimulateStageConfig(
            model=cfg.model,
            hardware=cfg.hardware,
            vidur=simulation_vidur(cfg, scheduler),
            workload_dir=str(workload_dir),
            profiling_root=cfg.profiling_root,
            arrivals_from=str(real_dir),  # the load the engine was really offered
            output=out,
            progress=cfg.progress,
        )
        sim_dir = _timed(p, "vidur_simulate", simulate_run, simulate_cfg, cfg.progress)
        compare_cfg = CompareStageConfig(
            real_run_dir=str(real_dir),
            sim_run_dir=str(sim_dir),
            compare=cfg.compare,
            output=out,
            progress=cfg.progress,
        )
        compare_dir = _timed(p, "compare", compare_run, compare_cfg, cfg.progress)
        p.update_meta(compare_dir=str(compare_dir))
    if cfg.progress:
        console.print(f"[bold]summary:[/] {compare_dir / 'summary.md'}")
    return compare_dir
