"""Synthetic Vidur profiling bundles for tests (:mod:`gpu_simulate_test.vidur_profile.synthetic`,
re-exported here), and the workload runs and simulation inputs tests build on them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gpu_simulate_test.config.schema import ModelConfig
from gpu_simulate_test.vidur_profile.synthetic import (
    CPU,
    QWEN3_0_6B,
    QWEN3_TINY,
    Roofline,
    SyntheticRanges,
    write_synthetic_bundle,
)

if TYPE_CHECKING:
    from gpu_simulate_test.vidur_simulate.inputs import Inputs

__all__ = [
    "CPU",
    "QWEN3_0_6B",
    "QWEN3_TINY",
    "Roofline",
    "SyntheticRanges",
    "synthetic_inputs",
    "write_synthetic_bundle",
    "write_workload_run",
]


def write_workload_run(
    root: Path,
    run_id: str,
    prefill: list[int] | np.ndarray,
    decode: list[int] | np.ndarray,
    arrival_time_s: list[float] | np.ndarray,
    model: ModelConfig = QWEN3_TINY,
) -> Path:
    """A complete workload run with exactly these requests, written by the workload stage code."""
    from gpu_simulate_test.core.traffic.workloads import write_workload_arrays

    return write_workload_arrays(root, run_id, prefill, decode, arrival_time_s, model)


def synthetic_inputs(
    compose_stage: Any, workload_dir: Path, profiles: Path, block_size: int
) -> Inputs:
    """A workload's checked simulation inputs (``vidur_simulate``'s ``prepare``) over a synthetic
    bundle at ``profiles``, simulated with ``vllm_v1`` at ``block_size``: for tests that look at
    what a simulation is given without running one."""
    from gpu_simulate_test.config.registry import to_typed
    from gpu_simulate_test.config.vidur import VidurSimulateStageConfig
    from gpu_simulate_test.vidur_simulate.stage import prepare

    cfg = compose_stage(
        "vidur_simulate",
        [f"workload_dir={workload_dir}", f"profiling_root={profiles}",
         "vidur.scheduler.name=vllm_v1", f"vidur.scheduler.block_size={block_size}"],
    )  # fmt: skip
    return prepare(to_typed(cfg, VidurSimulateStageConfig))
