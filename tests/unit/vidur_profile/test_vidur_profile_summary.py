"""The profile's closing table says what the bundle's files hold."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gpu_simulate_test.core.profiling.bundle import MLP_OPS
from gpu_simulate_test.vidur_profile import stage
from gpu_simulate_test.vidur_profile.profiler import ProfileTables

COLUMNS = ("backend", "phase", "batch_size", "num_q_tokens", "context_tokens", "step_ms")
STEPS = [  # as a calibration writes them: the sweeps, then longer contexts, then bursts
    ("hf_cb", "prefill", 1, 16, 16, 20.5, 1),
    ("hf_cb", "prefill", 1, 256, 256, 27.08, 1),
    ("hf_cb", "decode", 1, 1, 44, 14.74, 1),
    ("hf_cb", "decode", 32, 1, 44, 42.22, 1),
    ("hf_cb", "decode", 1, 1, 1020, 15.73, 1),
    ("hf_cb", "decode", 4, 1, 1020, 35.8, 1),
    ("hf_cb", "prefill", 2, 102, 102, 33.62, 2),
]


def test_engine_rows_name_the_smallest_and_largest_size_timed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    printed: dict[str, str] = {}

    def table(_title: str, _header: object, rows: list[list[str]]) -> None:
        printed.update({name: value for name, value in rows})

    monkeypatch.setattr(stage, "print_table", table)
    mlp = pd.DataFrame({"num_tokens": [1, 8]})
    for op in MLP_OPS:
        mlp[f"time_stats.{op}.median"] = 0.01
    ranges = {"max_num_tokens": 8, "max_batch_size": 32, "max_prefill_chunk": 8}
    meta = {
        "device_name": "cpu",
        "dtype": "float32",
        "timing_method": "perf_counter_ns",
        "ranges": {**ranges, "max_kv_cache_size": 1024},
        "profile_wall_time_s": 1.0,
        "model": {"name": "small"},
        "hardware": "cpu",
    }
    steps = pd.DataFrame(STEPS, columns=[*COLUMNS, "num_prompts"])
    stage.print_summary(meta, ProfileTables(mlp, pd.DataFrame()), tmp_path, tmp_path, steps)
    # not the longer context's batch of 4, nor the burst's two prompts of 102 tokens
    assert printed["engine hf_cb decode step"] == "14.74 ms at 1 requests, 42.22 ms at 32"
    assert printed["engine hf_cb prefill step"] == "20.50 ms at 16 tokens, 27.08 ms at 256"
