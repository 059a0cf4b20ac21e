"""The steps of a deep_profile run, in their fixed order, behind one signature.

Every step is ``step(ctx) -> StepOutcome`` and writes into ``<run>/<step>/``. A step that raises
is recorded as ``failed`` (with the error) and the next steps still run; the nsys/ncu steps
return ``skipped`` with the reason when the tool or the GPU is missing.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpu_simulate_test.config.deep_profile import DeepProfilePipeline, DeepProfileStageConfig
from gpu_simulate_test.core.model.modeling import build_model
from gpu_simulate_test.deep_profile import contract as files
from gpu_simulate_test.deep_profile.engine import (
    nvtx_for,
    nvtx_push_pop,
    serve_requests,
)
from gpu_simulate_test.deep_profile.inputs import ProfileInputs, warmup_requests
from gpu_simulate_test.deep_profile.metrics import serving_summary
from gpu_simulate_test.deep_profile.nsight.tools import StepOutcome, find_tool
from gpu_simulate_test.deep_profile.nsight_steps import preflight, run_ncu, run_nsys
from gpu_simulate_test.deep_profile.static import run_static_analysis
from gpu_simulate_test.deep_profile.torch_prof import run_torch_profiler
from gpu_simulate_test.io.artifacts import write_json

STEP_ORDER: tuple[str, ...] = ("static_analysis", "torch_profiler", "run_workload", "nsys", "ncu")
"""The order steps run in; ``run_workload`` is the app the nsys/ncu steps profile."""


def cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


@dataclass
class StepContext:
    """What the steps share: the config, the run directory, the requests, the model, results."""

    cfg: DeepProfileStageConfig
    run_dir: Path
    inputs: ProfileInputs
    results: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Each step's summary document, for the reports."""
    tool_finder: Callable[[str], str | None] = field(default=lambda name: find_tool(name))
    cuda_check: Callable[[], bool] = cuda_available
    _model: Any = None

    def model(self) -> Any:
        """The model, built once, on the configured device and dtype."""
        if self._model is None:
            cfg = self.cfg
            self._model = build_model(
                cfg.model, cfg.hardware.device, cfg.dtype, cfg.attn_implementation
            )
        return self._model


def enabled_steps(pipeline: DeepProfilePipeline) -> list[str]:
    """Names of the enabled steps, in :data:`STEP_ORDER`."""
    return [name for name in STEP_ORDER if getattr(pipeline, name).enable]


def _static(ctx: StepContext) -> StepOutcome:
    out = ctx.run_dir / files.STATIC_DIR
    ctx.results["static_analysis"] = run_static_analysis(ctx.cfg, ctx.inputs.requests, out)
    return StepOutcome.ok("static_analysis")


def _no_gpu(ctx: StepContext, step: str) -> StepOutcome | None:
    """``skipped`` when the configured device is a GPU that torch cannot see; None otherwise."""
    device = ctx.cfg.hardware.device
    if not device.startswith("cuda") or ctx.cuda_check():
        return None
    return StepOutcome.skipped(
        step,
        f"hardware={ctx.cfg.hardware.name} runs on {device}, but torch.cuda.is_available() is "
        "False (no GPU visible to torch); run on a GPU machine or pass hardware=cpu",
    )


def _torch(ctx: StepContext) -> StepOutcome:
    if (skip := _no_gpu(ctx, "torch_profiler")) is not None:
        return skip
    out = ctx.run_dir / files.TORCH_DIR
    ctx.results["torch_profiler"] = run_torch_profiler(ctx.cfg, ctx.model(), ctx.inputs, out)
    return StepOutcome.ok("torch_profiler")


def _run_workload(ctx: StepContext) -> StepOutcome:
    if (skip := _no_gpu(ctx, "run_workload")) is not None:
        return skip
    cfg = ctx.cfg
    opts = cfg.pipeline.run_workload
    device = cfg.hardware.device
    model = ctx.model()
    warmups = warmup_requests(ctx.inputs.requests, opts.num_warmup_requests, cfg.model.vocab_size)
    serve_requests(model, warmups, cfg.model, device=device, dtype=cfg.dtype)
    nvtx = nvtx_for(device)
    with nvtx_push_pop(nvtx, opts.nvtx_range):
        steps = serve_requests(
            model, ctx.inputs.requests, cfg.model, device=device, dtype=cfg.dtype, nvtx=nvtx
        )
    summary = {"nvtx": nvtx is not None, "serving": serving_summary(steps)}
    write_json(ctx.run_dir / files.RUN_WORKLOAD_DIR / files.WORKLOAD_TIMINGS, summary)
    ctx.results["run_workload"] = summary
    return StepOutcome.ok("run_workload")


def _nsight(ctx: StepContext, step: str) -> StepOutcome:
    tool_path = ctx.tool_finder(step)
    gate = preflight(step, step, tool_path, ctx.cfg.hardware.device, ctx.cuda_check())
    runner = run_nsys if step == "nsys" else run_ncu
    outcome, summary = runner(ctx.cfg, ctx.run_dir, tool_path, gate)
    ctx.results[step] = summary
    return outcome


STEPS: Mapping[str, Callable[[StepContext], StepOutcome]] = MappingProxyType(
    {
        "static_analysis": _static,
        "torch_profiler": _torch,
        "run_workload": _run_workload,
        "nsys": lambda ctx: _nsight(ctx, "nsys"),
        "ncu": lambda ctx: _nsight(ctx, "ncu"),
    }
)


def run_steps(
    ctx: StepContext, on_step: Callable[[StepOutcome], None] = lambda _o: None
) -> list[StepOutcome]:
    """Run the enabled steps in order; a failing step is recorded and the others still run."""
    outcomes: list[StepOutcome] = []
    for name in enabled_steps(ctx.cfg.pipeline):
        try:
            outcome = STEPS[name](ctx)
        except Exception as exc:
            where = ctx.run_dir / f"{name}_error.txt"
            where.write_text(traceback.format_exc(), encoding="utf-8")
            outcome = StepOutcome.failed(name, f"{type(exc).__name__}: {exc} (see {where.name})")
        outcomes.append(outcome)
        on_step(outcome)
    return outcomes
