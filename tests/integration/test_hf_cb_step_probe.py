"""``scripts/hf_cb_step_probe.py`` on CPU: one engine's steps timed from inside its thread."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # a real engine, every step

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "hf_cb_step_probe.py"


def test_probe_times_every_step_of_each_phase(tmp_path: Path) -> None:
    out = tmp_path / "probe"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--out",
            str(out),
            "--rate",
            "8",
            "--requests",
            "4",
            "--phases",
            "idle1,load_quiet",
            "--no-second",
            "--torch-threads",
            "1",
            "model=qwen3_tiny",
            "hardware=cpu",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    phases = {p["phase"]: p for p in json.loads((out / "phases.json").read_text())}
    assert list(phases) == ["idle1", "load_quiet"]
    steps = pd.read_csv(out / "steps.csv")
    idle = steps[steps["phase"] == "idle1"]
    # one request of 64 tokens: its prefill step, then a decode step per further token
    assert len(idle) == 64
    assert (idle["num_requests"] == 1).all() and idle["num_prefill"].sum() == 1
    assert (idle["end"] > idle["start"]).all()
    assert phases["idle1"]["decode_by_batch"].keys() == {"1"}
    load = steps[steps["phase"] == "load_quiet"]
    assert load["num_prefill"].sum() >= 4  # every request's prompt ran in some step
    assert phases["load_quiet"]["engine_itl_ms_p50"] > 0
    assert "idle1" in proc.stdout and "torch threads 1" in proc.stdout
