"""Build a workload: ``python -m gpu_simulate_test.cli.workload output.run_id=demo``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from gpu_simulate_test.cli._common import run_stage
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.schema import WorkloadStageConfig
from gpu_simulate_test.core.workloads import run

register_configs()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="workload")
def main(cfg: DictConfig) -> None:
    run_stage(cfg, WorkloadStageConfig, run)


if __name__ == "__main__":
    main()
