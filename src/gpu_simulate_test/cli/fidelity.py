"""How far the simulator is from the real engine, at several loads:
``python -m gpu_simulate_test.cli.fidelity [overrides]`` (tiny Qwen3 on CPU against vLLM by
default; ``+experiment=fidelity_qwen3_0_6b_h100`` on an H100). ``fidelity.phase=real`` on a GPU
machine, then ``fidelity.phase=sim fidelity.real_from=<that run>`` here; a multirun
(``-m backend=hf_cb,vllm output.run_id=f``) adds a combined report in
``tmp/fidelity/f-combined``."""

from __future__ import annotations

from pathlib import Path

import hydra
from omegaconf import DictConfig

from gpu_simulate_test.cli._common import MultirunReportCallback, run_stage
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.fidelity import FidelityStageConfig
from gpu_simulate_test.config.schema import OutputConfig
from gpu_simulate_test.fidelity.combined import check_combined_free, write_combined_report
from gpu_simulate_test.fidelity.stage import run

register_configs()


class CombinedReportCallback(MultirunReportCallback):
    """``hydra.callbacks.combined_report`` (configs/fidelity.yaml): after a multirun, its jobs'
    fidelity reports as one in ``<output.root>/fidelity/<output.run_id>-combined/``."""

    what = "combined report"
    missing = (
        "no combined report: it needs output.run_id and at least two jobs that wrote a "
        "report (fidelity.summarize=[...] writes one by hand)"
    )

    def check(self, output: OutputConfig) -> None:
        check_combined_free(output)

    def write(self, config: DictConfig, output: OutputConfig, progress: bool) -> Path | None:
        return write_combined_report(output, self.started, progress=progress)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="fidelity")
def main(cfg: DictConfig) -> None:
    run_stage(cfg, FidelityStageConfig, run)


if __name__ == "__main__":
    main()
