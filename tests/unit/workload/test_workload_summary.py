"""The workload stage's terminal table: every cell in the column its header names."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from gpu_simulate_test.core import reporting
from gpu_simulate_test.workload import stage

LENGTHS = {"min": 8.0, "p50": 19.0, "p90": 29.0, "p99": 32.0, "max": 32.0}


def test_session_rows_put_p50_and_p90_under_their_header(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a skewed draw: the mean (2.8 turns, 1.24 s) is not the p50 (3 turns, 1.23 s)
    meta = {
        "workload_id": "wl-x",
        "source": "synthetic",
        "summary": {
            "num_requests": 89,
            "duration_s": 32.8,
            "mean_sessions_per_s": 0.944,
            "num_prefill_tokens": LENGTHS,
            "num_decode_tokens": LENGTHS,
        },
        "session": {
            "num_sessions": 32,
            "turns_per_session": {"min": 2.0, "mean": 2.78125, "p50": 3.0, "p90": 4.0, "max": 4.0},
            "think_time_s": {"min": 0.52, "mean": 1.2386, "p50": 1.2303, "p90": 1.879, "max": 2.0},
        },
    }
    out = io.StringIO()
    wide = Console(file=out, width=200)
    monkeypatch.setattr(reporting, "console", wide)
    monkeypatch.setattr(stage, "console", wide)
    stage.print_summary(meta, Path("run"))
    text = out.getvalue()
    assert "value (min/p50/p90/p99/max)" in text
    assert "2 / 3 / 4 / – / 4 (mean 2.8)" in text  # no p99 kept for sessions: a dash
    assert "0.52 / 1.23 / 1.88 / – / 2.00 (mean 1.24)" in text
