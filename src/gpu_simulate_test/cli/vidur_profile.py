"""Profile a model on a device into a Vidur bundle:
``python -m gpu_simulate_test.cli.vidur_profile model=qwen3_tiny hardware=cpu``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from gpu_simulate_test.cli._common import run_stage
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.vidur import VidurProfileStageConfig
from gpu_simulate_test.vidur_profile.stage import run

register_configs()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="vidur_profile")
def main(cfg: DictConfig) -> None:
    run_stage(cfg, VidurProfileStageConfig, run)


if __name__ == "__main__":
    main()
