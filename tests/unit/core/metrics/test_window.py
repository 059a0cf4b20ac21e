"""The measured window: the warm-up left out, the steady-state check (core/metrics/window.py)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.core.metrics import window


def _requests(ttft: list[float], arrivals: list[float] | None = None) -> pd.DataFrame:
    n = len(ttft)
    arrival = np.arange(n, dtype=float) if arrivals is None else np.asarray(arrivals)
    return pd.DataFrame(
        {
            "request_id": range(n),
            "arrival_time_s": arrival + 0.001,  # sent a millisecond late
            "scheduled_arrival_time_s": arrival,
            "ttft_s": ttft,
            "e2e_s": np.asarray(ttft) + 0.5,
            "status": ["ok"] * n,
        }
    )


def test_the_warm_up_is_counted_from_the_first_scheduled_arrival() -> None:
    frame = _requests([0.1] * 10, arrivals=[10.0 + i for i in range(10)])
    keep = window.in_window(frame, 3.0)
    assert keep.tolist() == [False] * 3 + [True] * 7  # 10, 11, 12 s warm up; 13 s is in
    assert window.in_window(frame, 0.0).all()
    # without a scheduled arrival, the arrival itself
    plain = frame.drop(columns="scheduled_arrival_time_s")
    assert window.in_window(plain, 3.0).tolist() == [False] * 3 + [True] * 7


def test_a_steady_queue_passes_and_a_growing_one_does_not() -> None:
    steady = window.steady_state(_requests([0.1] * 30), warmup_s=5.0)
    assert steady["requests_warmup"] == 5 and steady["requests_measured"] == 25
    assert steady["queue_trend"] == pytest.approx(1.0)
    assert steady["completion_ratio"] == pytest.approx(1.0)
    assert steady["steady"] is True
    growing = window.steady_state(_requests([0.1 * (1 + i) for i in range(30)]), warmup_s=5.0)
    assert growing["queue_trend"] > window.STEADY_TREND
    assert growing["steady"] is False
    # too few requests to tell: no verdict rather than a pass
    few = window.steady_state(_requests([0.1] * 4), warmup_s=0.0)
    assert few["steady"] is None and few["queue_trend"] is None


def test_the_trend_reads_the_engine_clock_where_the_run_has_it() -> None:
    frame = _requests([0.1] * 30).assign(engine_ttft_s=[0.01 * (1 + i) for i in range(30)])
    verdict = window.steady_state(frame, warmup_s=0.0)
    assert verdict["trend_clock"] == "engine"
    assert verdict["steady"] is False  # the engine's queue grew; the client's column did not


def test_completion_ratio_of_a_queue_that_falls_behind() -> None:
    arrival = np.arange(11, dtype=float)
    assert window.completion_ratio(arrival, np.full(11, 0.2)) == pytest.approx(1.0)
    slow = window.completion_ratio(arrival, np.arange(11, dtype=float))  # finish at 2 x arrival
    assert slow == pytest.approx(0.5)
    assert math.isnan(window.completion_ratio(arrival[:1], np.ones(1)))


def test_compare_leaves_the_warm_up_out_of_both_sides() -> None:
    from gpu_simulate_test.compare.stage import after_warmup

    real = _requests([0.1] * 10)
    sim = real[["request_id", "arrival_time_s", "ttft_s", "e2e_s", "status"]].iloc[::-1]
    kept_real, kept_sim, n = after_warmup(real, sim, 2.5)
    assert n == 3
    assert sorted(kept_real["request_id"]) == sorted(kept_sim["request_id"]) == list(range(3, 10))
    assert after_warmup(real, sim, 0.0)[2] == 0
