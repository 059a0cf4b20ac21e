"""The timing helper: stats of known samples, a known sleep on CPU, the per-shape budget."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest

from gpu_simulate_test.vidur_profile import timing
from gpu_simulate_test.vidur_profile.timing import (
    CUDA_EVENTS,
    PERF_COUNTER,
    TimingPolicy,
    TimingStats,
    measure,
    timing_method,
)

# a known sleep is timed: run alone
pytestmark = pytest.mark.timing


def test_stats_of_known_samples() -> None:
    stats = TimingStats.from_samples([4.0, 1.0, 3.0, 2.0])
    assert (stats.min_ms, stats.max_ms, stats.mean_ms, stats.median_ms) == (1.0, 4.0, 2.5, 2.5)
    assert stats.std_ms == pytest.approx(1.118034, rel=1e-6)  # population std, as numpy's
    assert stats.repeats == 4
    assert list(stats.as_vidur("mlp_act")) == [
        f"time_stats.mlp_act.{s}" for s in ("min", "max", "mean", "median", "std")
    ]
    with pytest.raises(ValueError, match="no timing samples"):
        TimingStats.from_samples([])


def test_known_sleep_on_cpu_is_measured_in_milliseconds() -> None:
    calls: list[int] = []

    def sleep_5ms() -> None:
        calls.append(1)
        time.sleep(0.005)

    stats = measure(sleep_5ms, "cpu", TimingPolicy(warmup=2, repeats=4, min_repeats=4, budget_s=1))
    assert len(calls) == 6 and stats.repeats == 4
    assert 5.0 <= stats.min_ms <= stats.median_ms <= stats.max_ms
    assert stats.median_ms < 60  # generous: a loaded 2-core CI machine oversleeps


def test_measure_summarizes_exactly_its_timed_repeats(monkeypatch: pytest.MonkeyPatch) -> None:
    # a fake nanosecond clock under the CPU timer: each repeat lasts the next known duration
    durations_ms = [3.0, 1.0, 4.0, 1.5]
    ticks = iter([tick for d in durations_ms for tick in (0, int(d * 1e6))])
    clock = SimpleNamespace(perf_counter=time.perf_counter, perf_counter_ns=lambda: next(ticks))
    monkeypatch.setattr(timing, "time", clock)
    stats = measure(lambda: None, "cpu", TimingPolicy(warmup=2, repeats=4, budget_s=60))
    assert stats.repeats == 4 and (stats.min_ms, stats.max_ms) == (1.0, 4.0)
    assert stats.mean_ms == pytest.approx(np.mean(durations_ms))
    assert stats.median_ms == pytest.approx(np.median(durations_ms))
    assert stats.std_ms == pytest.approx(np.std(durations_ms))  # population, ddof=0


def test_budget_cuts_repeats_of_slow_ops_but_not_below_min_repeats() -> None:
    slow = TimingPolicy(warmup=3, repeats=50, min_repeats=3, budget_s=0.01)
    calls: list[int] = []

    def sleep_10ms() -> None:
        calls.append(1)
        time.sleep(0.01)

    stats = measure(sleep_10ms, "cpu", slow)
    assert stats.repeats == 3
    assert len(calls) == 1 + 3  # warm-up also stops once the budget is spent
    fast = measure(lambda: None, "cpu", TimingPolicy(warmup=0, repeats=50, budget_s=1.0))
    assert fast.repeats == 50


def test_timing_method_per_device() -> None:
    assert timing_method("cpu") == PERF_COUNTER
    assert timing_method("cuda:0") == CUDA_EVENTS


def test_bad_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="bad timing policy"):
        TimingPolicy(repeats=0)
