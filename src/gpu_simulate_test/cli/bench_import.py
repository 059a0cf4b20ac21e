"""Import a ``vllm bench serve`` or GuideLLM result as our runs, or export one of ours:
``python -m gpu_simulate_test.cli.bench_import source=result.json``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from gpu_simulate_test.bench_import.stage import run
from gpu_simulate_test.cli._common import run_stage
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.bench_import import BenchImportStageConfig

register_configs()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="bench_import")
def main(cfg: DictConfig) -> None:
    run_stage(cfg, BenchImportStageConfig, run)


if __name__ == "__main__":
    main()
