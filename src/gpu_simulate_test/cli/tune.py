"""The best vLLM knobs for a workload and latency goals, by simulation, confirmed on the real
engine: ``python -m gpu_simulate_test.cli.tune [overrides]`` (tiny Qwen3 on CPU against vLLM by
default), e.g. ``'tune.space.max_num_seqs=[2,8,32]' capacity.slo.ttft_ms=200``;
``tune.verify=false`` for the simulation alone."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from gpu_simulate_test.cli._common import run_stage
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.tune import TuneStageConfig
from gpu_simulate_test.tune.stage import run

register_configs()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="tune")
def main(cfg: DictConfig) -> None:
    run_stage(cfg, TuneStageConfig, run)


if __name__ == "__main__":
    main()
