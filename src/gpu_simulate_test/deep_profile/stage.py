"""``deep_profile`` stage: run the enabled steps into ``tmp/deep_profile/<run_id>/``; report."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from gpu_simulate_test.config.deep_profile import DeepProfileStageConfig
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.deep_profile import contract as files
from gpu_simulate_test.deep_profile.inputs import load_inputs
from gpu_simulate_test.deep_profile.nsight.tools import StepOutcome, find_tool
from gpu_simulate_test.deep_profile.report import stage_report, stakeholder_summary
from gpu_simulate_test.deep_profile.steps import (
    STEP_ORDER,
    StepContext,
    cuda_available,
    enabled_steps,
    run_steps,
)
from gpu_simulate_test.io.artifacts import atomic_open, write_json
from gpu_simulate_test.io.runs import (
    default_run_id,
    git_commit,
    host_info,
    package_versions,
    start_run,
)

STAGE = "deep_profile"


def environment() -> dict[str, Any]:
    """Host, GPUs, packages, git commit, CUDA and the Nsight tools found: for ``env.json``."""
    import torch

    return {
        "host": host_info(),
        "packages": package_versions(),
        "git": git_commit(),
        "python_executable": sys.executable,
        "torch_cuda_available": bool(torch.cuda.is_available()),
        "torch_cuda_version": torch.version.cuda,
        "tools": {"nsys": find_tool("nsys"), "ncu": find_tool("ncu")},
    }


def _write_yaml(path: Path, data: Mapping[str, Any]) -> None:
    with atomic_open(path) as handle:
        yaml.safe_dump(dict(data), handle, sort_keys=False, allow_unicode=True)


def run(cfg: DeepProfileStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """Profile ``cfg``'s requests with every enabled step; returns the run directory."""
    inputs = load_inputs(cfg)
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    title = f"{cfg.model.name} on {cfg.hardware.name}"
    with start_run(cfg.output.root, STAGE, run_id, resolved_config, cfg.output.overwrite) as r:
        write_json(r.file(files.ENV), environment())
        _write_yaml(r.file(files.CONFIG), resolved_config)
        _write_yaml(r.file(files.INPUTS), inputs.to_dict())
        ctx = StepContext(cfg, r.path, inputs, cuda_check=cuda_available)

        def _say(outcome: StepOutcome) -> None:
            if cfg.progress:
                reason = f": {outcome.reason}" if outcome.reason else ""
                console.print(f"[bold]{outcome.step}[/] {outcome.status}{reason}")

        outcomes = run_steps(ctx, _say)
        disabled = [s for s in STEP_ORDER if s not in enabled_steps(cfg.pipeline)]
        write_json(
            r.file(files.STEPS),
            {"steps": [o.to_dict() for o in outcomes], "disabled": disabled},
        )
        nsight = {s: ctx.results[s] for s in ("nsys", "ncu") if ctx.results.get(s)}
        r.file(files.REPORT).write_text(
            stage_report(
                title,
                outcomes,
                ctx.results.get("static_analysis"),
                ctx.results.get("torch_profiler"),
                nsight,
            ),
            encoding="utf-8",
        )
        r.file(files.STAKEHOLDER_SUMMARY).write_text(
            stakeholder_summary(
                title, outcomes, ctx.results.get("torch_profiler"), cfg.hardware.name
            ),
            encoding="utf-8",
        )
        r.update_meta(
            steps={o.step: o.status for o in outcomes},
            workload=inputs.source,
            num_requests=len(inputs.requests),
        )
    if cfg.progress:
        console.print(f"[bold]report:[/] {r.path / files.REPORT}")
        console.print(f"[bold]artifacts:[/] {r.path}")
    return r.path
