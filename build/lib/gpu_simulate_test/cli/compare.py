"""Compare a real run with a simulated run of the same workload:
``python -m gpu_simulate_test.cli.compare real_run_dir=tmp/real_bench/<id>
sim_run_dir=tmp/vidur_simulate/<id>``; a sweep report over compare runs:
``python -m gpu_simulate_test.cli.compare 'sweep_dirs=[tmp/compare/q-*]'``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from gpu_simulate_test.compare.stage import run
from gpu_simulate_test.cli._common import run_stage
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.compare import CompareStageConfig

register_configs()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="compare")
def main(cfg: DictConfig) -> None:
    run_stage(cfg, CompareStageConfig, run)


if __name__ == "__main__":
    main()
