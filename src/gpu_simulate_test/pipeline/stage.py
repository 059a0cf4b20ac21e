"""The pipeline: workload → vidur_profile (reused when it fits) → real_bench → vidur_simulate
(of the arrivals the real run actually sent) → compare, in one process: a recipe over the shared
steps of :mod:`gpu_simulate_test.orchestrate`.

Every stage lands in ``<output.root>/<stage>/<run_id>/`` with the same run id; the pipeline's
own run (``<output.root>/pipeline/<run_id>/run_meta.json``) lists them and the time each took.
Before any stage runs, :func:`claim_outputs` refuses when one of those directories exists
(unless ``output.overwrite``), so a refusal leaves no half-finished pipeline behind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.vidur import VidurSchedulerConfig
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.runs import (
    Run,
    RunExistsError,
    default_run_id,
    retire_run,
    start_run,
)
from gpu_simulate_test.orchestrate.configs import at_run, nested_in
from gpu_simulate_test.orchestrate.profiling import ensure_bundle, plan_for_lengths, profile_plan
from gpu_simulate_test.orchestrate.serving import check_sessions_served, served
from gpu_simulate_test.orchestrate.step_level import simulate_at_level
from gpu_simulate_test.orchestrate.steps import (
    Stages,
    check_trace,
    make_workload,
    simulate_and_compare,
)
from gpu_simulate_test.orchestrate.truth import trusted_truth
from gpu_simulate_test.pipeline.contract import PIPELINE_STAGES

RUNS_DIR = layout.RUNS_DIR
"""Under the pipeline's own run directory: its other stage runs (the truth's repeat, the re-runs
of a disturbed one, the calibration's validation replay), so that ``<root>/real_bench/`` and
``<root>/compare/`` hold each pipeline's main runs only."""


def repeat_id(run_id: str) -> str:
    """The run id of the truth's second run (``pipeline.real_repeat``)."""
    return f"{run_id}-r2"


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


def claim_outputs(cfg: PipelineStageConfig, run_id: str) -> None:
    """Claim the run directories the pipeline will create, before anything is created: refuse
    when one exists and ``output.overwrite`` is false; with it, retire the old answer (the
    compare run) first, so that a run replaced and interrupted leaves no answer over it.
    ``vidur_profile`` counts only when the pipeline will profile (decided on the workload it is
    about to generate, without writing it)."""
    if cfg.output.overwrite:
        # the answer of the run replaced goes first: one interrupted before its compare stage
        # leaves no complete compare run over stages it had already replaced
        answer = layout.run_dir(cfg.output.root, "compare", run_id)
        if answer.exists():
            retire_run(answer)
        return
    # the repeat and the re-runs go in the pipeline's own directory (RUNS_DIR), one of these
    paths = [layout.run_dir(cfg.output.root, stage, run_id) for stage in PIPELINE_STAGES]
    profile_dir = layout.run_dir(cfg.output.root, "vidur_profile", run_id)
    if profile_dir.exists() and cfg.reuse_profile:
        from gpu_simulate_test.core.traffic.workloads import generate

        workload, _ = generate(cfg.workload, cfg.model)
        decided = plan_for_lengths(cfg, workload.num_prefill_tokens, workload.num_decode_tokens)
        if not decided.misfits:
            paths.remove(profile_dir)
    check_runs_free(paths)


def at_level(
    cfg: PipelineStageConfig,
    scheduler: VidurSchedulerConfig,
    workload_dir: Path,
    real_dir: Path,
    p: Run,
    stages: Stages,
) -> Path | None:
    """The real run's arrivals simulated at its own step level, into the pipeline's own runs
    (:func:`~gpu_simulate_test.orchestrate.step_level.simulate_at_level`), its level recorded
    as ``at_real_step_level``; None where the run has none. A diagnosis beside the answer, so a
    failure here is said (on the terminal and as the record's ``error``) and the pipeline goes
    on to its answer without it."""
    try:
        level, at_dir = simulate_at_level(
            cfg, scheduler, workload_dir, real_dir, p.path / RUNS_DIR, stages
        )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        console.print(f"[yellow]the simulation at the real run's step level failed: {exc}")
        p.update_meta(at_real_step_level={"error": f"{type(exc).__name__}: {exc}"})
        return None
    p.update_meta(at_real_step_level=level)
    return at_dir


def run(cfg: PipelineStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """Run every stage; returns the compare run directory (with ``summary.md``)."""
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    check_trace(cfg.workload, cfg.model)  # a bad trace refused before the run exists
    check_sessions_served(cfg)  # a multi-turn workload needs a backend that runs sessions
    claim_outputs(cfg, run_id)
    cfg = at_run(cfg, run_id)
    with start_run(cfg.output.root, "pipeline", run_id, resolved_config, cfg.output.overwrite) as p:
        stages = Stages(record_in=p, progress=cfg.progress)
        workload_dir = make_workload(cfg, stages)
        decided = profile_plan(cfg, workload_dir)
        p.update_meta(
            scheduler=dataclasses.asdict(decided.scheduler),
            scheduler_derived_from=cfg.backend.name if decided.derived else None,
        )
        if decided.misfits and not cfg.output.overwrite:
            # a safety net (the profile stage's overwrite is meant for the bundle):
            # claim_outputs decided on the same workload before any stage
            check_runs_free(
                [layout.run_dir(cfg.output.root, "vidur_profile", run_id)],
                "the workload stage ran, the pipeline stopped before profiling",
            )
        within = p.path / RUNS_DIR
        with served(cfg, p.path, p, workload_dir) as at_server:
            ensure_bundle(at_server, decided, workload_dir, stages)
            truth = trusted_truth(
                at_server, workload_dir, stages, run_id, cfg.real_reruns, rerun_root=within
            )
            repeat = (
                trusted_truth(
                    nested_in(at_server, within), workload_dir, stages, repeat_id(run_id),
                    cfg.real_reruns, label="real_bench_repeat",
                )
                if cfg.real_repeat
                else None
            )  # fmt: skip
        truths = [t for t in (truth, repeat) if t is not None]
        p.update_meta(truth=[t.to_dict() for t in truths])
        replaced = tuple(a.real_dir for t in truths for a in t.attempts[:-1])
        at_level_dir = None
        if cfg.at_level:  # the same arrivals at the real run's own step level: a diagnosis
            at_level_dir = at_level(cfg, decided.scheduler, workload_dir, truth.real_dir, p, stages)
        _, compare_dir = simulate_and_compare(
            cfg,
            decided.scheduler,
            workload_dir,
            truth.real_dir,
            stages,
            None if repeat is None else repeat.real_dir,
            replaced,
            seeds=cfg.sim_seeds,
            seeds_root=within,
            at_level_dir=at_level_dir,
        )
        p.update_meta(compare_dir=str(compare_dir))
    latest = ""
    try:
        latest = f" (also {layout.point_latest(cfg.output.root, compare_dir) / 'summary.md'})"
    except OSError as exc:  # a file or folder of the user's own there: leave it
        console.print(f"[yellow]{cfg.output.root}/{layout.LATEST} not updated: {exc}")
    if cfg.progress:  # the last line: where the result is
        console.print(f"[bold]summary:[/] {compare_dir / 'summary.md'}{latest}", soft_wrap=True)
    return compare_dir
