"""``benchmarks/fidelity/bench_engine_queued``: where a stored run's QUEUED stamps lie between
the engine's steps."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from benchmarks.fidelity.bench_engine_queued import stamps


def test_a_stamp_after_a_step_is_measured_from_its_end_and_to_the_next_start(
    tmp_path: Path,
) -> None:
    pd.DataFrame({"start_time_s": [0.0, 0.0103, 0.5], "end_time_s": [0.010, 0.020, 0.51]}).to_csv(
        tmp_path / "engine_schedule.csv", index=False
    )
    # one queued 0.28 ms after the first step (0.02 ms before the second), one on an idle
    # engine's wake-up 480 ms after the second step's end (not counted), one before any step
    queued = [0.01028, 0.49998, -0.001]
    pd.DataFrame({"engine_arrival_time_s": queued}).to_csv(
        tmp_path / "request_metrics.csv", index=False
    )
    n, busy, after, before = stamps(tmp_path, busy_ms=2.0)
    assert (n, busy) == (3, 1)
    assert after == pytest.approx(np.array([0.28])) and before == pytest.approx(np.array([0.02]))
