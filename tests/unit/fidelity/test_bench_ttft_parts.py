"""``bench_ttft_parts``' pooled table: each part over every run's requests together, real and
simulated at p50 / p90 / p99, so a part whose tail alone is short shows as such."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from benchmarks.fidelity.bench_ttft_parts import PARTS, SIDES, pooled_quantiles, sim_parts


def frame(values: np.ndarray, ids: range) -> pd.DataFrame:
    return pd.DataFrame({part: values for part in (*PARTS, *SIDES)}, index=list(ids))


def test_the_pooled_table_reads_every_runs_requests_and_a_short_tail() -> None:
    body = np.linspace(1.0, 10.0, 100)
    real = [frame(body, range(100)), frame(body, range(100))]
    sim = [frame(np.minimum(body, 5.0), range(100)), frame(body, range(50, 150))]
    out = pooled_quantiles(list(zip(real, sim, strict=True)))
    assert set(out) == {*PARTS, *SIDES}
    way_in = out["way_in"]
    # over the requests both sides have (the second run's sim shares 50 of its 100)
    assert way_in["p50"]["real_ms"] == pytest.approx(float(np.percentile(
        np.r_[body, body[50:]], 50)), abs=1e-3)  # fmt: skip
    assert way_in["p50"]["sim_ms"] == pytest.approx(float(np.percentile(
        np.r_[np.minimum(body, 5.0), body[:50]], 50)), abs=1e-3)  # fmt: skip
    short = way_in["p99"]["sim_vs_real"]
    assert short is not None and short < -0.01  # the first run's capped tail shows at p99
    same = pooled_quantiles([(real[0], real[0].copy())])
    assert all(c["sim_vs_real"] == 0.0 for cells in same.values() for c in cells.values())


def test_a_simulation_gives_its_ways_where_it_writes_the_way_back(tmp_path: Path) -> None:
    """The way in (send → queued, with the wait for a step) and the way back from the columns
    the simulation writes; an older simulation without ``frontend_first_token_s``: no ways."""
    sim = pd.DataFrame({
        "request_id": [0, 1], "engine_scheduling_delay_s": [0.001, 0.0],
        "scheduling_delay_s": [0.005, 0.002], "frontend_delay_s": [0.009, 0.006],
        "frontend_first_token_s": [0.002, 0.003], "ttft_s": [0.020, 0.016],
    })  # fmt: skip
    sim.to_csv(tmp_path / "request_metrics.csv", index=False)
    parts = sim_parts(tmp_path)
    assert parts["way_in"].tolist() == pytest.approx([7.0, 3.0])
    assert parts["way_back"].tolist() == pytest.approx([2.0, 3.0])
    assert parts["held"].tolist() == pytest.approx([4.0, 2.0])
    # the two cuts add up the same: the front end and the wait = the way in and the way back
    assert (parts["front_end"] + parts["held"]).tolist() == pytest.approx(
        (parts["way_in"] + parts["way_back"]).tolist()
    )
    sim.drop(columns="frontend_first_token_s").to_csv(tmp_path / "request_metrics.csv")
    assert "way_in" not in sim_parts(tmp_path) and "ttft" in sim_parts(tmp_path)
