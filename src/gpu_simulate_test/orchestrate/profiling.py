"""Plan and profile: the scheduler the simulation uses (derived from the engine's knobs), what
the workload asks of the profiling bundle, why the bundle in
``<profiling_root>/<hardware>/<model>`` does not fit, and a fresh profile when it does not.

Never imports Vidur: the real phase of a split fidelity campaign (the GPU machine's half) plans
and profiles too. A fresh calibration's validation replay (:mod:`.validation`, which simulates)
is imported only when it runs.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gpu_simulate_test.config.backends import BACKENDS, own_knobs
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.renamed import current_names
from gpu_simulate_test.config.vidur import (
    ProfileRangesConfig,
    VidurProfileStageConfig,
    VidurSchedulerConfig,
)
from gpu_simulate_test.core.engines.knobs import derive_scheduler
from gpu_simulate_test.core.profiling.bundle import Bundle, BundleRanges, load_bundle
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, as_stored_json, read_json
from gpu_simulate_test.orchestrate.configs import (
    at_run,
    engine_calibration,
    nested_in,
    stage_output,
)
from gpu_simulate_test.orchestrate.steps import Stages
from gpu_simulate_test.vidur_simulate import plan


def dtype_for(requested: str, device: str) -> str:
    """What ``auto`` means for profiling: bf16 on CUDA, fp32 on CPU (as the profiler decides)."""
    if requested != "auto":
        return requested
    return "bfloat16" if device.startswith("cuda") else "float32"


SERVER_FIELDS: tuple[str, ...] = ("base_url", "served_model_name", "server")
"""Backend fields that say where a server runs, not what engine it is: a calibration made
through one started for an orchestrator stands for the same engine started anywhere."""


ROUTING_FIELDS: tuple[str, ...] = ("router", "router_poll_s")
"""Backend fields that say how a fleet's client routes, not how its engines step: a fleet's
calibration sends every request to each server (:mod:`~.core.engines.vllm_neighbours`)."""


def engine_identity(backend: Mapping[str, Any]) -> dict[str, Any]:
    """A stored backend config without :data:`SERVER_FIELDS` and :data:`ROUTING_FIELDS`, and
    without the knobs of other engines a calibration recorded before each engine had its own
    config class."""
    skip = SERVER_FIELDS + ROUTING_FIELDS
    return {k: v for k, v in own_knobs(backend).items() if k not in skip}


def with_new_defaults(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded backend config with the knobs its engine gained since, at their defaults: a
    calibration made before a knob existed ran the engine as that knob's default does (a knob
    renamed since is read under its name today, :func:`current_names`)."""
    recorded = current_names(recorded)
    name = recorded.get("name")
    if name not in BACKENDS:
        return dict(recorded)
    defaults = as_stored_json(dataclasses.asdict(BACKENDS[str(name)]()))
    return {**{k: v for k, v in defaults.items() if k not in recorded}, **recorded}


def calibration_misfits(
    cfg: PipelineStageConfig, bundle: Bundle, accept_older: bool = False
) -> list[str]:
    """Why the bundle's engine calibration does not stand for ``cfg.backend`` (empty if it does).
    ``accept_older``: a calibration by an older version of this code stands (a sim phase, which
    cannot calibrate again: it simulates with what was measured, :func:`older_calibration`
    says what that leaves out)."""
    from gpu_simulate_test.calibration.record import CALIBRATION_VERSION

    name = cfg.backend.name
    recorded = bundle.engine_calibration(name)
    if recorded is None or not bundle.engine_steps_path.is_file():
        return [f"no engine calibration for backend {name}"]
    version = recorded.get("version")
    older = isinstance(version, int) and version < CALIBRATION_VERSION
    if version != CALIBRATION_VERSION and not (accept_older and older):
        return [
            f"engine calibration of {name} is version {recorded.get('version')}, this code "
            f"calibrates version {CALIBRATION_VERSION}"
        ]
    if name == "vllm":
        from gpu_simulate_test.core.engines.vllm_knobs import vllm_version

        made_on, installed = (recorded.get("engine") or {}).get("vllm_version"), vllm_version()
        if installed and made_on != installed:
            return [f"engine calibration of vllm was made on vLLM {made_on}, this is {installed}"]
        servers = int(getattr(cfg.backend, "servers", 1))
        timed_beside = (recorded.get("engine") or {}).get("neighbours")
        beside = servers > 1 and cfg.calibrate_beside_neighbours
        if beside and timed_beside != servers - 1:
            return [
                f"engine calibration of vllm timed its engine beside {timed_beside or 0} "
                f"other server(s); backend.servers={servers} is timed beside {servers - 1}"
            ]
    want = as_stored_json(dataclasses.asdict(engine_calibration(cfg)))
    have = dict(recorded.get("settings", {}))
    want["backend"] = engine_identity(want["backend"])
    have["backend"] = engine_identity(with_new_defaults(have.get("backend") or {}))
    differ = sorted(k for k in want if k != "enable" and have.get(k) != want[k])
    if differ:
        which = ", ".join(k + _knobs_apart(have.get(k), want[k]) for k in differ)
        return [f"engine calibration of {name} was made with other {which}"]
    return []


def _knobs_apart(had: Any, wants: Any, most: int = 4) -> str:
    """`` (max_num_seqs 8, here 32)``: the first ``most`` keys two settings blocks differ in,
    with the calibration's value and this run's; empty where either is no block."""
    if not isinstance(had, dict) or not isinstance(wants, dict):
        return ""
    keys = sorted(k for k in had.keys() | wants.keys() if had.get(k) != wants.get(k))
    parts = [f"{k} {had.get(k)}, here {wants.get(k)}" for k in keys[:most]]
    more = f"; {len(keys) - most} more" if len(keys) > most else ""
    return f" ({'; '.join(parts)}{more})" if parts else ""


def bundle_misfits(
    cfg: PipelineStageConfig,
    scheduler: VidurSchedulerConfig,
    needs: plan.Requirements,
    accept_older: bool = False,
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
    want_dtype = dtype_for(cfg.profiling.dtype, cfg.hardware.device)
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
        reasons += calibration_misfits(cfg, bundle, accept_older)
    return reasons


def carry_bundle(cfg: PipelineStageConfig, root: Path) -> Path:
    """Copy the bundle ``cfg`` uses (``<profiling_root>/<hardware>/<model>``) under ``root``, so
    that a run directory carries it and travels whole; nothing when there is none (the run then
    profiles into ``root``). Returns ``root``."""
    source = layout.bundle_dir(cfg.profiling_root, cfg.hardware.name, cfg.model.name)
    target = layout.bundle_dir(str(root), cfg.hardware.name, cfg.model.name)
    if source.is_dir() and source.resolve() != target.resolve():
        shutil.copytree(source, target, dirs_exist_ok=True)
    return root


def widest(a: plan.Requirements | None, b: plan.Requirements) -> plan.Requirements:
    """Each requirement the larger of ``a``'s and ``b``'s (``b`` alone when ``a`` is None)."""
    if a is None:
        return b
    return plan.Requirements(
        **{f.name: max(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(b)}
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


def plan_for_lengths(
    cfg: PipelineStageConfig,
    prefill: np.ndarray,
    decode: np.ndarray,
    *,
    covering: plan.Requirements | None = None,
    because: str | None = None,
    accept_older: bool = False,
) -> ProfilePlan:
    """Decide, from a workload's prompt and output lengths, whether to profile.

    ``covering``: requirements the bundle must meet besides this workload's (a campaign's
    earlier loads). ``because``: profile regardless, for this reason. Otherwise the bundle is
    profiled again when ``cfg.reuse_profile`` is false or :func:`bundle_misfits` finds a reason
    (``accept_older``: an older version's engine calibration is not one).
    """
    scheduler, derived = derive_scheduler(cfg.backend, cfg.vidur.scheduler, int(prefill.max()))
    needs = widest(covering, plan.requirements(prefill, decode, scheduler))
    if because:
        misfits: tuple[str, ...] = (because,)
    elif not cfg.reuse_profile:
        misfits = ("reuse_profile=false",)
    else:
        misfits = tuple(bundle_misfits(cfg, scheduler, needs, accept_older))
    return ProfilePlan(scheduler, derived, needs, misfits)


def profile_plan(
    cfg: PipelineStageConfig,
    workload_dir: Path | str,
    *,
    covering: plan.Requirements | None = None,
    because: str | None = None,
    accept_older: bool = False,
) -> ProfilePlan:
    """:func:`plan_for_lengths` on the workload written in ``workload_dir``."""
    from gpu_simulate_test.core.traffic.workloads import load_workload

    prefill, decode = plan.workload_lengths(load_workload(workload_dir).lengths)
    return plan_for_lengths(
        cfg, prefill, decode, covering=covering, because=because, accept_older=accept_older
    )


def recorded_plan(
    cfg: PipelineStageConfig,
    workload_dir: Path,
    recorded_scheduler: Mapping[str, Any],
    where: Path,
    what: str,
) -> ProfilePlan:
    """A split run's sim phase: the plan for ``what`` (a load, a search) from its recorded bundle
    (``cfg.profiling_root``), which must cover it (a sim phase never profiles), with Vidur's
    scheduler derived again and checked against the one the real phase recorded in ``where``
    (empty: none recorded, nothing to check). An engine calibration by an older version of this
    code is simulated with as it is (:func:`older_calibration` says what it lacks: the caller
    says it, once for its run, not once per load)."""
    decided = profile_plan(cfg, workload_dir, accept_older=True)
    derived = as_stored_json(dataclasses.asdict(decided.scheduler))
    # a knob added since the real phase ran is held at its default there
    defaults = as_stored_json(dataclasses.asdict(VidurSchedulerConfig()))
    recorded = {**{k: v for k, v in defaults.items() if k not in recorded_scheduler},
                **dict(recorded_scheduler)}  # fmt: skip
    if recorded_scheduler and derived != recorded:
        raise ArtifactError(
            f"{where}: {what}: the scheduler derived now {derived} differs from the one the "
            f"real phase recorded {dict(recorded_scheduler)}"
        )
    if decided.misfits:
        raise ArtifactError(
            f"{cfg.profiling_root}: the bundle does not cover {what}: " + "; ".join(decided.misfits)
        )
    return decided


def existing_bundle_ranges(cfg: PipelineStageConfig) -> BundleRanges | None:
    """What the bundle in ``<profiling_root>/<hardware>/<model>`` covers (its context capped at the
    model's); None when there is none or it cannot be read."""
    path = layout.bundle_dir(cfg.profiling_root, cfg.hardware.name, cfg.model.name)
    if not path.is_dir():
        return None
    try:
        ranges = load_bundle(path, timings_checked=False).ranges  # about to be replaced
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
    workload_dir: Path | str,
) -> VidurProfileStageConfig:
    """The vidur_profile config whose bundle covers ``needs`` and at least what the bundle it
    replaces covered, calibrating ``cfg.backend`` (at a served engine when ``cfg`` points at one).

    ``output.overwrite`` is true so that the bundle is replaced; for the stage's run directory
    that is only safe once the orchestrator checked it is free (the pipeline's
    ``claim_outputs``) or owns it (fidelity, capacity).
    """
    return VidurProfileStageConfig(
        model=cfg.model,
        hardware=cfg.hardware,
        profiling=cfg.profiling,
        profile=profile_ranges(cfg.profile, needs, existing_bundle_ranges(cfg)),
        block_size=scheduler.block_size,
        profiling_root=cfg.profiling_root,
        workload_dir=str(workload_dir),
        engine=engine_calibration(cfg),
        output=dataclasses.replace(stage_output(cfg), overwrite=True),
        progress=cfg.progress,
    )


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


def ensure_bundle(
    cfg: PipelineStageConfig, decided: ProfilePlan, workload_dir: Path | str, stages: Stages
) -> Path:
    """Profile (and calibrate the engine) when ``decided`` says the bundle does not fit, and
    stop when the fresh profile still looks disturbed; otherwise reuse it, saying so. Returns
    the bundle's directory."""
    bundle = layout.bundle_dir(cfg.profiling_root, cfg.hardware.name, cfg.model.name)
    if not decided.misfits:
        stages.record(reused_bundle=str(bundle))
        if cfg.progress:
            console.print(f"reusing the profiling bundle {bundle} (it covers this run)")
        return bundle
    from gpu_simulate_test.vidur_profile.stage import run as profile_run

    if cfg.progress:
        console.print("profiling, because: " + "; ".join(decided.misfits))
    profile_cfg = profile_config(cfg, decided.scheduler, decided.needs, workload_dir)
    path = stages.run("vidur_profile", profile_run, profile_cfg)
    check_profile_quality(cfg, path)  # a disturbed profile is refused before it is validated
    if cfg.validate_calibration and cfg.engine_overhead and cfg.workload.source == "synthetic":
        path = check_calibration(cfg, decided, workload_dir, stages, path)
        check_profile_quality(cfg, path)
    return path


def check_calibration(
    cfg: PipelineStageConfig,
    decided: ProfilePlan,
    workload_dir: Path | str,
    stages: Stages,
    bundle: Path,
) -> Path:
    """The fresh calibration's validation replay (:mod:`.validation`); on a miss the profile
    and calibration are redone once (``<run_id>-recalibration``) and checked again. Records the
    checks in the bundle; returns its directory."""
    from gpu_simulate_test.orchestrate import validation
    from gpu_simulate_test.vidur_profile.stage import run as profile_run

    checks: list[dict[str, Any]] = []
    # its stage runs go in the orchestrator's own directory and are listed in the check, not
    # among the orchestrator's own stages
    within = None if stages.record_in is None else stages.record_in.path / layout.RUNS_DIR
    for attempt in (1, 2):
        check = validation.validate(cfg, decided.scheduler, attempt, within=within)
        checks.append(check)
        console.print(validation.describe(check))
        if check["passed"] is not False or attempt == 2:
            break
        console.print("[yellow]the calibration missed its validation replay: redoing it once")
        again = at_run(cfg, f"{cfg.output.run_id or 'profile'}-recalibration")
        again = nested_in(again, within)
        redo = profile_config(again, decided.scheduler, decided.needs, workload_dir)
        bundle = stages.run("vidur_profile", profile_run, redo)
    failed = checks[-1]["passed"] is False
    validation.record(bundle, checks, validation.failure_warning(checks) if failed else None)
    stages.record(calibration_check=checks)
    return bundle


def older_calibration(cfg: PipelineStageConfig) -> str | None:
    """One line, when the bundle's engine calibration of ``cfg.backend`` was made by an older
    version of this code: which version, and what later versions measure that it does not (the
    simulation goes on with what it measured); None otherwise (or without one)."""
    from gpu_simulate_test.calibration.record import CALIBRATION_VERSION, measured_since

    if not cfg.engine_overhead:
        return None
    path = layout.bundle_dir(cfg.profiling_root, cfg.hardware.name, cfg.model.name)
    try:
        recorded = load_bundle(path, timings_checked=False).engine_calibration(cfg.backend.name)
    except ArtifactError:
        return None
    version = (recorded or {}).get("version")
    if not isinstance(version, int) or version >= CALIBRATION_VERSION:
        return None
    return (
        f"{path}: the engine calibration of {cfg.backend.name} is version {version}, this code "
        f"calibrates version {CALIBRATION_VERSION}: simulated with what it measured, without "
        + "; ".join(measured_since(version))
    )
