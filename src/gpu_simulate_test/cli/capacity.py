"""The highest request rate a deployment serves within latency goals, by simulation:
``python -m gpu_simulate_test.cli.capacity [overrides]`` (tiny Qwen3 on CPU, vLLM's knobs, by
default), e.g. ``capacity.slo.ttft_ms=200 capacity.slo.tpot_ms=40 workload.num_requests=10000``;
``capacity.verify=true`` checks the answer on the real engine."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from gpu_simulate_test.capacity.stage import run
from gpu_simulate_test.cli._common import run_stage
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.capacity import CapacityStageConfig

register_configs()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="capacity")
def main(cfg: DictConfig) -> None:
    run_stage(cfg, CapacityStageConfig, run)


if __name__ == "__main__":
    main()
