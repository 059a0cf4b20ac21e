"""``bench_ttft_parts``' pooled table: each part over every run's requests together, real and
simulated at p50 / p90 / p99, so a part whose tail alone is short shows as such."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from benchmarks.fidelity.bench_ttft_parts import PARTS, SIDES, pooled_quantiles


def frame(values: np.ndarray, ids: range) -> pd.DataFrame:
    return pd.DataFrame({part: values for part in (*PARTS, *SIDES)}, index=list(ids))


def test_the_pooled_table_reads_every_runs_requests_and_a_short_tail() -> None:
    body = np.linspace(1.0, 10.0, 100)
    real = [frame(body, range(100)), frame(body, range(100))]
    sim = [frame(np.minimum(body, 5.0), range(100)), frame(body, range(50, 150))]
    out = pooled_quantiles(list(zip(real, sim, strict=True)))
    assert set(out) == {*PARTS, *SIDES}
    way_in = out["way_in"]
    # the median agrees (the first run's sim is cut at 5 ms, the second's shares 50 requests)
    assert way_in["p50"]["real_ms"] == pytest.approx(float(np.percentile(
        np.r_[body, body[50:]], 50)), abs=1e-3)  # fmt: skip
    assert way_in["p99"]["sim_vs_real"] < -0.01  # the capped tail shows at p99
    same = pooled_quantiles([(real[0], real[0].copy())])
    assert all(c["sim_vs_real"] == 0.0 for cells in same.values() for c in cells.values())
