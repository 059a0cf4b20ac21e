"""Every stage in one command: ``python -m gpu_simulate_test.cli.pipeline [overrides]``
(tiny Qwen3 on CPU by default; ``+experiment=qwen3_0_6b_h100`` for a full GPU comparison)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from gpu_simulate_test.cli._common import run_stage
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.pipeline.run import run
from gpu_simulate_test.real_bench.backends import BackendError
from gpu_simulate_test.reporting import console

register_configs()


def _run(cfg: PipelineStageConfig, resolved: dict[str, Any]) -> Path:
    try:
        return run(cfg, resolved)
    except BackendError as exc:  # the engine died mid-run: the real bench wrote partial results
        console.print(f"[bold red]run failed:[/] {exc}")
        sys.exit(1)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="pipeline")
def main(cfg: DictConfig) -> None:
    run_stage(cfg, PipelineStageConfig, _run)


if __name__ == "__main__":
    main()
