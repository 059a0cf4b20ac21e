"""A disturbed truth is marked and re-run: a CPU-bound process, not ours, started mid-run on the
client's core, makes the real bench mark its run (foreign CPU) and the orchestrator run it again
once the machine is quiet."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.io import layout
from gpu_simulate_test.orchestrate.configs import at_run
from gpu_simulate_test.orchestrate.steps import make_workload
from gpu_simulate_test.orchestrate.truth import trusted_truth

pytestmark = [pytest.mark.integration, pytest.mark.slow]

HOG_S = 14.0
"""How long the foreign process spins: past the first run's replay, then it ends by itself."""


def start_foreign_hog(seconds: float) -> None:
    """A CPU-bound process on core 0 that is not our descendant (``setsid -f`` forks it off and
    its parent exits at once), as another job on the machine would be."""
    code = (
        "import os, time\n"
        "os.sched_setaffinity(0, {0})\n"
        f"end = time.time() + {seconds}\n"
        "while time.time() < end:\n"
        "    pass\n"
    )
    subprocess.run(["setsid", "-f", sys.executable, "-c", code], check=True)


def test_a_foreign_process_mid_run_is_marked_and_the_run_redone(
    compose_stage: Any, tmp_path: Path
) -> None:
    composed = compose_stage(
        "pipeline",
        [
            "backend=hf_cb",
            "workload.num_requests=40",
            "workload.qps=5",
            "workload.prompt_len.max=32",
            "workload.output_len.max=8",
            "num_warmup_requests=1",
            f"output.root={tmp_path / 'tmp'}",
            "progress=false",
        ],
    )
    cfg = at_run(to_typed(composed, PipelineStageConfig), "hog")
    workload_dir = make_workload(cfg)
    timer = threading.Timer(2.0, start_foreign_hog, (HOG_S,))  # mid-run: the replay is ~8 s
    timer.start()
    truth = trusted_truth(cfg, workload_dir, run_id="hog", reruns=1, quiet_wait_s=60)
    timer.join()

    first, second = truth.attempts  # one re-run: the first was marked
    assert first.disturbed and any(r.startswith("foreign_cpu") for r in first.reasons)
    meta = json.loads((first.real_dir / layout.RUN_META).read_text())
    sign = meta["disturbance"]["signs"]["foreign_cpu"]
    assert sign["measured"] and sign["figure"] > 0.25, sign
    summary = json.loads((first.real_dir / "summary.json").read_text())
    assert summary["disturbance"]["disturbed"] is True  # the mark travels with the figures
    # the re-run waited for the hog to end and ran on a quiet machine
    assert second.real_dir.name == "hog-rerun1" and second.waited_s > 0
    again = json.loads((second.real_dir / layout.RUN_META).read_text())
    assert again["disturbance"]["signs"]["foreign_cpu"]["disturbed"] is False
    assert truth.real_dir == second.real_dir and first.real_dir.is_dir()  # evidence kept
