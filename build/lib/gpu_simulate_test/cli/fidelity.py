"""How far the simulator is from the real engine, at several loads:
``python -m gpu_simulate_test.cli.fidelity [overrides]`` (tiny Qwen3 on CPU against vLLM by
default; ``+experiment=fidelity_qwen3_0_6b_h100`` on an H100). ``fidelity.phase=real`` on a GPU
machine, then ``fidelity.phase=sim fidelity.real_from=<that run>`` here; a multirun
(``-m backend=hf_cb,vllm output.run_id=f``) adds a combined report in
``tmp/fidelity/f-combined``."""

from __future__ import annotations

import signal
import sys
import traceback
from datetime import UTC, datetime
from typing import Any

import hydra
from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from gpu_simulate_test.cli._common import USER_ERRORS, print_error, run_stage
from gpu_simulate_test.cli.pipeline import _output
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.fidelity import FidelityStageConfig
from gpu_simulate_test.fidelity.combined import check_combined_free, write_combined_report
from gpu_simulate_test.fidelity.stage import run
from gpu_simulate_test.core.reporting import console

register_configs()


class CombinedReportCallback(Callback):
    """``hydra.callbacks.combined_report`` (configs/fidelity.yaml): after a multirun, its jobs'
    fidelity reports as one in ``<output.root>/fidelity/<output.run_id>-combined/``.

    Hydra turns a callback's exception into a warning and exits 0, so a failure here prints one
    error line and exits itself: 2 for an input error, 1 for anything else.
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.started = datetime.now(UTC)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = datetime.now(UTC)
        if not self.enabled:
            return
        try:
            check_combined_free(_output(config))
        except USER_ERRORS as exc:
            print_error("error", exc)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.enabled:
            return
        progress = bool(config.get("progress", True))
        try:
            path = write_combined_report(_output(config), self.started, progress=progress)
        except USER_ERRORS as exc:
            print_error("combined report failed", exc)
            sys.exit(2)
        except Exception:
            traceback.print_exc()
            console.print("[bold red]combined report failed[/] (traceback above)")
            sys.exit(1)
        if path is None and progress:
            console.print(
                "no combined report: it needs output.run_id and at least two jobs that wrote a "
                "report (fidelity.summarize=[...] writes one by hand)"
            )


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="fidelity")
def main(cfg: DictConfig) -> None:
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # started in the background with SIGINT ignored: a sent one (a GPU script's step time
        # limit) must still stop the run cleanly, keeping the loads measured so far
        signal.signal(signal.SIGINT, signal.default_int_handler)
    run_stage(cfg, FidelityStageConfig, run)


if __name__ == "__main__":
    main()
