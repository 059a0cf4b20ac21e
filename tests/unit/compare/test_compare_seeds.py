"""The simulation's own draws beside the truth's: the same workload simulated with other seeds,
and per figure the range of the simulator's error over all its seeds on both clocks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.clocks import clock_rows, clocks_markdown
from gpu_simulate_test.compare.seeds import SeedRun, error_range, seeds_note, with_seeds


def _side(ttft: float, n: int = 4) -> m.SideTimes:
    return m.SideTimes(
        arrival_time_s=np.arange(n, dtype=float),
        ttft_s=np.full(n, ttft),
        tpot_s=np.full(n, 0.009),
        e2e_s=np.full(n, 0.090),
        scheduling_delay_s=np.full(n, np.nan),
    )


def _joined(sim_ttft: float, n: int = 4) -> m.JoinedRequests:
    return m.JoinedRequests(
        request_id=np.arange(n, dtype=np.int64),
        num_prefill_tokens=np.full(n, 16, dtype=np.int64),
        num_decode_tokens=np.full(n, 8, dtype=np.int64),
        real=_side(0.030, n),  # the client's clock
        sim=_side(sim_ttft, n),
    )


def _seed(sim_ttft: float, frontend_s: float, seed: int) -> SeedRun:
    requests = pd.DataFrame({"request_id": range(4), "frontend_delay_s": [frontend_s] * 4})
    return SeedRun(Path(f"sim-seed{seed}"), seed, requests, _joined(sim_ttft))


def _real() -> pd.DataFrame:
    """The engine's clock: TTFT 20 ms for every request."""
    return pd.DataFrame(
        {
            "request_id": range(4),
            "engine_ttft_s": [0.020] * 4,
            "engine_tpot_s": [0.009] * 4,
            "engine_e2e_s": [0.085] * 4,
        }
    )


def test_the_error_over_the_seeds_spans_every_seed_on_each_clock() -> None:
    main_sim = pd.DataFrame({"request_id": range(4), "frontend_delay_s": [0.004] * 4})
    rows = clock_rows(_real(), _joined(0.024), main_sim)  # engine 20 ms, client 30 ms
    # two more seeds: client 27 and 33 ms, their engine's 22 and 25 ms (less their front end)
    seeded = with_seeds(rows, [_seed(0.027, 0.005, 43), _seed(0.033, 0.008, 44)])
    assert seeded is not None
    ttft = next(r for r in seeded if r["metric"] == "ttft" and r["stat"] == "p90")
    assert ttft["seeds_sim_s"] == pytest.approx([0.027, 0.033])
    assert ttft["seeds_sim_engine_s"] == pytest.approx([0.022, 0.025])
    assert ttft["error_vs_client"] == pytest.approx(0.024 / 0.030 - 1)  # the main one unmoved
    assert ttft["seeds_vs_client"] == pytest.approx([0.024 / 0.030 - 1, 0.033 / 0.030 - 1])
    assert ttft["seeds_vs_engine"] == pytest.approx([0.0, 0.25])  # main 20 ms, seeds 22 / 25
    text = clocks_markdown(seeded, seeds_note([_seed(0.027, 0.005, 43)]))
    assert "over its seeds (client)" in text and "over its seeds (engine)" in text
    assert "| -20.0%..+10.0% |" in text and "(seeds 43)" in text


def test_pooled_the_seeds_requests_are_read_as_one_distribution() -> None:
    """Two seeds of four requests each beside the main one's four: the pooled p50 is the
    median of all twelve, not the median of the three medians."""
    main_sim = pd.DataFrame({"request_id": range(4), "frontend_delay_s": [0.0] * 4})
    main = SeedRun(Path("sim"), None, main_sim, _joined(0.024))
    rows = clock_rows(_real(), main.joined, main_sim)
    low = SeedRun(Path("s1"), 43, main_sim, _joined(0.021))
    seeded = with_seeds(rows, [low, _seed(0.033, 0.0, 44)], main)
    assert seeded is not None
    ttft = next(r for r in seeded if r["metric"] == "ttft" and r["stat"] == "p50")
    assert ttft["pooled_sim_s"] == pytest.approx(0.024)  # 21, 24, 33 ms four times each
    assert ttft["pooled_vs_client"] == pytest.approx(0.024 / 0.030 - 1)
    assert ttft["pooled_vs_engine"] == pytest.approx(0.024 / 0.020 - 1)
    p99 = next(r for r in seeded if r["metric"] == "ttft" and r["stat"] == "p99")
    assert p99["pooled_sim_s"] == pytest.approx(0.033)
    assert ", pooled -20.0% |" in clocks_markdown(seeded)
    # without the main simulation's requests there is no pooled figure
    alone = with_seeds(rows, [low])
    assert alone is not None and "pooled_vs_client" not in alone[0]


def test_without_seeds_the_rows_and_the_table_are_as_before() -> None:
    rows = clock_rows(_real(), _joined(0.024))
    assert with_seeds(rows, []) is rows
    assert with_seeds(None, [_seed(0.027, 0.005, 43)]) is None
    assert rows is not None and "seeds" not in clocks_markdown(rows)


def test_an_error_range_skips_what_cannot_be_read() -> None:
    assert error_range(0.011, [float("nan"), 0.009], 0.010) == pytest.approx([-0.1, 0.1])
    assert all(np.isnan(v) for v in error_range(float("nan"), [], 0.010))
