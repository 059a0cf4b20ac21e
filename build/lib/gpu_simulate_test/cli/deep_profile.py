"""Profile a model on a workload, formulas to kernels:
``python -m gpu_simulate_test.cli.deep_profile [model=qwen3_tiny]
[workload_dir=tmp/workload/demo] [pipeline.nsys.enable=false]``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from gpu_simulate_test.cli._common import run_stage
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.deep_profile import DeepProfileStageConfig
from gpu_simulate_test.deep_profile.stage import run

register_configs()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="deep_profile")
def main(cfg: DictConfig) -> None:
    run_stage(cfg, DeepProfileStageConfig, run)


if __name__ == "__main__":
    main()
