"""Every stage in one command: ``python -m gpu_simulate_test.cli.pipeline [overrides]``
(tiny Qwen3 on CPU by default; ``+experiment=qwen3_0_6b_h100`` for a full GPU comparison)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import hydra
from omegaconf import DictConfig

from gpu_simulate_test.cli._common import MultirunReportCallback, print_error, run_stage
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.compare import CompareOptions
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import OutputConfig
from gpu_simulate_test.core.engines import BackendError
from gpu_simulate_test.pipeline.stage import run
from gpu_simulate_test.pipeline.sweep import check_sweep_report_free, write_sweep_report

register_configs()


def _run(cfg: PipelineStageConfig, resolved: dict[str, Any]) -> Path:
    try:
        return run(cfg, resolved)
    except BackendError as exc:  # the engine died mid-run: the real bench wrote partial results
        print_error("run failed", exc)
        sys.exit(1)


class SweepReportCallback(MultirunReportCallback):
    """``hydra.callbacks.sweep_report`` (configs/pipeline.yaml): after a multirun, report its
    jobs' compare runs as one sweep in ``<output.root>/compare/<output.run_id>-sweep/``."""

    what = "sweep report"
    missing = (
        "no sweep report: it needs output.run_id and at least two completed jobs "
        "(python -m gpu_simulate_test.cli.compare 'sweep_dirs=[...]' writes one by hand)"
    )

    def check(self, output: OutputConfig) -> None:
        check_sweep_report_free(output)

    def write(self, config: DictConfig, output: OutputConfig, progress: bool) -> Path | None:
        opts = config.compare
        options = CompareOptions(plots=bool(opts.plots), sweep_x=str(opts.sweep_x))
        return write_sweep_report(output, options, self.started, progress=progress)


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="pipeline")
def main(cfg: DictConfig) -> None:
    run_stage(cfg, PipelineStageConfig, _run)


if __name__ == "__main__":
    main()
