"""Replay a workload against a real model: ``python -m gpu_simulate_test.cli.real_bench
workload_dir=tmp/workload/demo [backend=hf_generate] [model=qwen3_0_6b hardware=h100]``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from gpu_simulate_test.cli._common import print_error, run_stage
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.core.engines import BackendError
from gpu_simulate_test.real_bench.stage import run

register_configs()


def _run(cfg: RealBenchStageConfig, resolved: dict[str, Any]) -> Path:
    try:
        return run(cfg, resolved)
    except BackendError as exc:  # the engine died mid-run: partial results are written
        print_error("run failed", exc)
        sys.exit(1)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="real_bench")
def main(cfg: DictConfig) -> None:
    run_stage(cfg, RealBenchStageConfig, _run)


if __name__ == "__main__":
    main()
