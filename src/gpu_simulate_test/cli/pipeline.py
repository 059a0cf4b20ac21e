"""Every stage in one command: ``python -m gpu_simulate_test.cli.pipeline [overrides]``
(tiny Qwen3 on CPU by default; ``+experiment=qwen3_0_6b_h100`` for a full GPU comparison)."""

from __future__ import annotations

import sys
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import hydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from gpu_simulate_test.cli._common import USER_ERRORS, print_error, run_stage
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.compare import CompareOptions
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import OutputConfig
from gpu_simulate_test.core.engines import BackendError
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.pipeline.stage import run
from gpu_simulate_test.pipeline.sweep import check_sweep_report_free, write_sweep_report

register_configs()


def _run(cfg: PipelineStageConfig, resolved: dict[str, Any]) -> Path:
    try:
        return run(cfg, resolved)
    except BackendError as exc:  # the engine died mid-run: the real bench wrote partial results
        print_error("run failed", exc)
        sys.exit(1)


def _output(config: DictConfig) -> OutputConfig:
    out = config.output
    run_id = None if out.run_id is None else str(out.run_id)
    return OutputConfig(root=str(out.root), run_id=run_id, overwrite=bool(out.overwrite))


class SweepReportCallback(Callback):
    """``hydra.callbacks.sweep_report`` (configs/pipeline.yaml): after a multirun, report its
    jobs' compare runs as one sweep in ``<output.root>/compare/<output.run_id>-sweep/``.

    Hydra turns a callback's exception into a warning and exits 0, so failures here print one
    error line and exit the process themselves (``SystemExit`` is not caught): 2 for an input
    error (the report directory exists, ...), 1 for anything else.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.started = datetime.now(UTC)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = datetime.now(UTC)
        if not self.enabled:
            return
        try:
            check_sweep_report_free(_output(config))
        except USER_ERRORS as exc:  # before any job has run
            print_error("error", exc)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.enabled:
            return
        opts = config.compare
        options = CompareOptions(plots=bool(opts.plots), sweep_x=str(opts.sweep_x))
        progress = bool(config.get("progress", True))
        try:
            path = write_sweep_report(_output(config), options, self.started, progress=progress)
        except USER_ERRORS as exc:
            print_error("sweep report failed", exc)
            sys.exit(2)
        except Exception:
            traceback.print_exc()
            console.print("[bold red]sweep report failed[/] (traceback above)")
            sys.exit(1)
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
