"""Every stage in one command: ``python -m gpu_simulate_test.cli.pipeline [overrides]``
(tiny Qwen3 on CPU by default; ``+experiment=qwen3_0_6b_h100`` for a full GPU comparison)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import hydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from gpu_simulate_test.cli._common import run_stage
from gpu_simulate_test.config.compare import CompareOptions
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.schema import OutputConfig
from gpu_simulate_test.pipeline.run import run
from gpu_simulate_test.pipeline.sweep import write_sweep_report
from gpu_simulate_test.real_bench.backends import BackendError
from gpu_simulate_test.reporting import console

register_configs()


def _run(cfg: PipelineStageConfig, resolved: dict[str, Any]) -> Path:
    try:
        return run(cfg, resolved)
    except BackendError as exc:  # the engine died mid-run: the real bench wrote partial results
        console.print(f"[bold red]run failed:[/] {exc}")
        sys.exit(1)


class SweepReportCallback(Callback):
    """``hydra.callbacks.sweep_report`` (configs/pipeline.yaml): after a multirun, report its
    jobs' compare runs as one sweep in ``<output.root>/compare/<output.run_id>-sweep/``."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.started = datetime.now(UTC)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = datetime.now(UTC)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.enabled:
            return
        out, opts = config.output, config.compare
        run_id = None if out.run_id is None else str(out.run_id)
        output = OutputConfig(root=str(out.root), run_id=run_id, overwrite=bool(out.overwrite))
        options = CompareOptions(plots=bool(opts.plots), sweep_x=str(opts.sweep_x))
        progress = bool(config.get("progress", True))
        path = write_sweep_report(output, options, self.started, progress=progress)
        if path is None and progress:
            console.print(
                "no sweep report: it needs output.run_id and at least two completed jobs "
                "(python -m gpu_simulate_test.cli.compare 'sweep_dirs=[...]' writes one by hand)"
            )


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="pipeline")
def main(cfg: DictConfig) -> None:
    run_stage(cfg, PipelineStageConfig, _run)


if __name__ == "__main__":
    main()
