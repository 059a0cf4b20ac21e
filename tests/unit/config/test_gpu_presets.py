"""The presets scripts/gpu_validate.sh runs agree with each other, so that its one profile serves
both real phases, and its plan fits the device window."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_simulate_test.config.registry import STAGE_SCHEMAS, to_typed
from gpu_simulate_test.core.engines.knobs import derive_scheduler
from gpu_simulate_test.vidur_simulate import plan

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "scripts" / "gpu_validate.sh"
PRESETS = {
    "qwen3_0_6b_h100": "gpu_chat",
    "qwen3_4b_h100": "gpu_chat",
    "qwen3_8b_h100": "gpu_chat",
    "cpu_tiny": "cpu_chat",
}
"""Each family of presets (``profile_``, ``fidelity_``, ``capacity_`` + its name) and the
workload option whose lengths its workload step builds."""


def _typed(compose_stage: Any, stage: str, overrides: list[str]) -> Any:
    return to_typed(compose_stage(stage, overrides), STAGE_SCHEMAS[stage])


def test_the_default_campaign_calibrates_before_each_load(compose_stage: Any) -> None:
    """On this project's CPU host the default campaign calibrates right before each load (the
    calibration's server against the judged servers moved the 85% rows); the presets below
    profile once."""
    assert _typed(compose_stage, "fidelity", []).fidelity.calibrate_each_load
    assert not _typed(
        compose_stage, "fidelity", ["fidelity.calibrate_each_load=false"]
    ).fidelity.calibrate_each_load


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_one_profile_serves_both_real_phases(compose_stage: Any, preset: str) -> None:
    """The profile preset's bundle is the one the fidelity and capacity presets would reuse: the
    same model, device, dtype and engine (the calibration's knobs), ranges that cover their
    workloads, and those workloads the lengths of the workload step's option."""
    profile = _typed(compose_stage, "vidur_profile", [f"+experiment=profile_{preset}"])
    lengths = _typed(compose_stage, "workload", [f"workload={PRESETS[preset]}"]).workload
    gpu = profile.hardware.device.startswith("cuda")
    assert profile.engine.enable
    for stage in ("fidelity", "capacity"):
        cfg = _typed(compose_stage, stage, [f"+experiment={stage}_{preset}"])
        said = f"{stage}_{preset} vs profile_{preset}"
        assert (cfg.model, cfg.hardware) == (profile.model, profile.hardware), said
        assert cfg.backend == profile.engine.backend, said
        assert cfg.profiling.dtype == profile.profiling.dtype, said
        assert cfg.profile == profile.profile, said
        if stage == "fidelity":  # profiled once for the session, not again before each load
            assert not cfg.fidelity.calibrate_each_load, said
        assert cfg.workload.prompt_len == lengths.prompt_len, said
        assert cfg.workload.output_len == lengths.output_len, said
        # the bundle covers the longest requests the engine's scheduler can batch
        prompts = np.array([lengths.prompt_len.max] * 64)
        outputs = np.array([lengths.output_len.max] * 64)
        scheduler, _ = derive_scheduler(cfg.backend, cfg.vidur.scheduler, int(prompts.max()))
        needs = plan.requirements(prompts, outputs, scheduler)
        ranges = profile.profile
        assert needs.max_batch_tokens <= ranges.max_num_tokens, said
        assert needs.max_batch_size <= ranges.max_batch_size, said
        assert needs.max_prefill_chunk <= ranges.max_prefill_chunk, said
        assert needs.max_request_tokens <= ranges.max_kv_cache_size, said
        if gpu:  # the GPU truth: bf16, CUDA graphs (docs/gpu.md)
            assert cfg.dtype == "bfloat16" and cfg.backend.use_cuda_graph is True, said
    capacity = _typed(compose_stage, "capacity", [f"+experiment=capacity_{preset}"])
    assert capacity.capacity.verify_budget_s > 0  # the real search fits its step


def _plan(**env: str) -> tuple[str, int]:
    """The script's plan line and its sum (PLAN_ONLY: nothing runs)."""
    proc = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=REPO,
        env={**os.environ, "PLAN_ONLY": "1", "OUT": env.pop("OUT"), **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = re.search(r"sum (\d+) s", proc.stdout)
    assert found, proc.stdout
    return proc.stdout, int(found.group(1))


def test_the_window_plan_fits_for_qwen3_0_6b_on_an_h100(tmp_path: Path) -> None:
    said, total = _plan(OUT=str(tmp_path))
    assert "workload 20 s, profile 200 s, fidelity 240 s, capacity 240 s" in said
    assert total <= 720, said
    assert "more than one device command" in said  # and says how to split it
    one_call, part = _plan(OUT=str(tmp_path), STEPS="workload profile fidelity")
    assert part <= 570 and "more than one" not in one_call
    _, capacity = _plan(OUT=str(tmp_path), STEPS="capacity", BUDGET_CAPACITY_S="300")
    assert capacity == 300


def test_a_model_without_presets_is_refused_before_anything_runs(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=REPO,
        env={**os.environ, "PLAN_ONLY": "1", "OUT": str(tmp_path), "MODEL": "qwen3_1_7b"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2 and "no preset profile_qwen3_1_7b_h100" in proc.stderr
    assert not (tmp_path / "steps.txt").exists()
