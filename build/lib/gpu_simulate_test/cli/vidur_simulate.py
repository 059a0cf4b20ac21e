"""The vidur_simulate stage: ``python -m gpu_simulate_test.cli.vidur_simulate workload_dir=...``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from gpu_simulate_test.cli._common import run_stage
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.vidur import VidurSimulateStageConfig
from gpu_simulate_test.vidur_simulate.stage import run

register_configs()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="vidur_simulate")
def main(cfg: DictConfig) -> None:
    run_stage(cfg, VidurSimulateStageConfig, run)


if __name__ == "__main__":
    main()
