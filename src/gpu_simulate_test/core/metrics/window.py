"""The measured window of a run: the warm-up left out, and whether the rest was a steady state.

A load's first seconds fill an empty queue: their requests see a transient that no steady-state
percentile describes. They are replayed (real) and simulated like every other request, so the
queue behind them is the same on both sides, and left out of every statistic.

Whether what remains is a steady state is checked, not assumed, on two signs:

- **completion / arrival**: the rate at which requests finish over the rate at which they
  arrive, each over its own span; below :data:`SUSTAINED_RATIO` the engine fell behind;
- **the queue's trend**: the median TTFT of the window's last third against its first third; a
  queue that grows all along shows it as a ratio well above one (:data:`STEADY_TREND`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.core.metrics import percentiles as pct

SUSTAINED_RATIO = 0.9
"""Completion rate / arrival rate at or above this: the queue did not grow (allowing for the
spread of request lengths at the ends of a run)."""
STEADY_TREND = 1.5
"""Last third's median TTFT / first third's at or under which the queue did not grow."""


def reference_arrivals_s(requests: pd.DataFrame) -> np.ndarray:
    """When each request was due (``scheduled_arrival_time_s`` of a real run), else when it
    arrived (``arrival_time_s``): the clock the warm-up is counted on."""
    column = (
        "scheduled_arrival_time_s"
        if "scheduled_arrival_time_s" in requests.columns
        and requests["scheduled_arrival_time_s"].notna().all()
        else "arrival_time_s"
    )
    return pd.to_numeric(requests[column], errors="coerce").to_numpy(dtype=float)


def in_window(requests: pd.DataFrame, warmup_s: float) -> np.ndarray:
    """Per row of a ``request_metrics`` table: whether the request arrived after the warm-up
    (``warmup_s`` seconds from the first arrival). Every row when ``warmup_s`` is 0."""
    if warmup_s <= 0 or requests.empty:
        return np.ones(len(requests), dtype=bool)
    arrivals = reference_arrivals_s(requests)
    return arrivals - np.nanmin(arrivals) >= warmup_s


def window_start_s(requests: pd.DataFrame, warmup_s: float) -> float:
    """Where the measured window of a ``request_metrics`` table begins on the run's clock: its
    time 0, or after a warm-up, the first arrival plus ``warmup_s`` (:func:`in_window`)."""
    if warmup_s <= 0 or requests.empty:
        return 0.0
    return float(np.nanmin(reference_arrivals_s(requests))) + warmup_s


def completion_ratio(arrival_s: np.ndarray, e2e_s: np.ndarray) -> float:
    """Completion rate / arrival rate of the requests given (each over its own span; arrivals of
    every request, completions of those with a finite E2E): 1.0 the engine kept up; NaN with
    fewer than two of either."""
    arrival_s = np.asarray(arrival_s, dtype=float)
    finish = arrival_s + np.asarray(e2e_s, dtype=float)
    finish = finish[np.isfinite(finish)]
    if finish.size < 2 or arrival_s.size < 2:
        return float("nan")
    arrival_rate = (arrival_s.size - 1) / max(float(arrival_s.max() - arrival_s.min()), 1e-9)
    completion_rate = (finish.size - 1) / max(float(finish.max() - finish.min()), 1e-9)
    return completion_rate / arrival_rate


def queue_trend(arrival_s: np.ndarray, ttft_s: np.ndarray) -> float:
    """Median TTFT of the last third of the requests (by arrival) / that of the first third;
    NaN with fewer than six requests."""
    order = np.argsort(np.asarray(arrival_s, dtype=float), kind="stable")
    ttft = np.asarray(ttft_s, dtype=float)[order]
    ttft = ttft[np.isfinite(ttft)]
    third = ttft.size // 3
    if third < 2:
        return float("nan")
    first, last = pct.describe(ttft[:third]).median, pct.describe(ttft[-third:]).median
    return last / first if first > 0 else float("nan")


def steady_state(requests: pd.DataFrame, warmup_s: float) -> dict[str, Any]:
    """The measured window of one ``request_metrics`` table: requests in it and left out as
    warm-up, completion / arrival, the queue's trend, and the verdict ``steady`` (None when too
    few requests to tell). TTFT is the engine's own where the run has it."""
    window = in_window(requests, warmup_s)
    ok = window & (requests["status"].astype(str) == "ok").to_numpy()
    frame = requests[ok]
    clock = (
        "engine"
        if "engine_ttft_s" in frame.columns and frame["engine_ttft_s"].notna().any()
        else "client"
    )
    ttft = frame["engine_ttft_s" if clock == "engine" else "ttft_s"]
    arrivals = frame["arrival_time_s"].to_numpy(dtype=float)
    ratio = completion_ratio(arrivals, frame["e2e_s"].to_numpy(dtype=float))
    trend = queue_trend(arrivals, pd.to_numeric(ttft, errors="coerce").to_numpy(dtype=float))
    known = bool(np.isfinite(ratio) and np.isfinite(trend))
    return {
        "warmup_s": warmup_s,
        "requests_measured": int(window.sum()),
        "requests_warmup": int((~window).sum()),
        "completion_ratio": round(ratio, 3) if np.isfinite(ratio) else None,
        "queue_trend": round(trend, 3) if np.isfinite(trend) else None,
        "trend_clock": clock,
        "steady": (ratio >= SUSTAINED_RATIO and trend <= STEADY_TREND) if known else None,
    }
