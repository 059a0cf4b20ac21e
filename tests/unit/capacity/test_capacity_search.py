"""The capacity search on a known latency curve: grid, bisection, the answer and its limits."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_simulate_test.capacity.band import band_cells, band_markdown, band_record, in_band
from gpu_simulate_test.capacity.search import Point, grid, judge, latency_agreement, search
from gpu_simulate_test.config.capacity import CapacityOptions, SloConfig
from gpu_simulate_test.config.schema import ConfigError


def _curve(knee: float) -> Any:
    """TTFT p90 = 50 ms below ``knee`` req/s, rising steeply above it; calls are recorded."""
    calls: list[float] = []

    def evaluate(qps: float, phase: str) -> Point:
        calls.append(qps)
        ttft = 50.0 if qps <= knee else 50.0 + 1000.0 * (qps - knee)
        latency = {"ttft_p90": ttft, "tpot_p90": 10.0, "e2e_p90": ttft + 100.0}
        meets, missed = judge(latency, {"ttft": 100.0}, 90)
        return Point(qps, phase, latency, meets, missed)

    evaluate.calls = calls  # type: ignore[attr-defined]
    return evaluate


def test_grid_is_geometric_and_rounded() -> None:
    assert grid(1.0, 64.0, 7) == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    assert len(grid(0.5, 100.0, 8)) == 8


def test_search_brackets_the_knee_and_bisects_it() -> None:
    evaluate = _curve(knee=10.0)  # goal missed above 10.05 req/s
    answer = search(evaluate, 1.0, 64.0, points=7, refine=4)
    assert evaluate.calls[:7] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]
    assert len(evaluate.calls) == 11  # 7 grid + 4 refine
    low, high = answer.bracket
    assert answer.qps == low and low <= 10.05 < high  # type: ignore[operator]
    assert high is not None and low is not None and high / low < 16.0 / 8.0  # narrower step
    assert [p.qps for p in answer.points] == sorted(p.qps for p in answer.points)
    first_miss = next(p for p in answer.points if not p.meets)
    assert first_miss.violated and first_miss.violated[0].startswith("ttft_p90 ")


def test_search_says_when_the_range_is_wrong() -> None:
    none = search(_curve(knee=0.1), 1.0, 8.0, points=4, refine=3)
    assert none.qps is None and "lower capacity.qps_min" in none.note
    every = search(_curve(knee=100.0), 1.0, 8.0, points=4, refine=3)
    assert every.qps == 8.0 and every.bracket == (8.0, None)
    assert "raise capacity.qps_max" in every.note


def test_a_nan_percentile_misses_the_goal() -> None:
    meets, missed = judge({"tpot_p90": float("nan")}, {"tpot": 30.0}, 90)
    assert not meets and missed == ("tpot_p90 nan > 30",)


def test_slo_config_refuses_no_goal_and_odd_percentiles() -> None:
    with pytest.raises(ConfigError, match="set at least one of"):
        SloConfig()
    with pytest.raises(ConfigError, match="percentile=80 is not one of 50, 90, 95, 99"):
        SloConfig(percentile=80, ttft_ms=100.0)
    assert SloConfig(ttft_ms=100.0, e2e_ms=900.0).goals() == {"ttft": 100.0, "e2e": 900.0}


def test_the_grid_goes_on_below_qps_min_until_a_rate_meets() -> None:
    evaluate = _curve(knee=2.5)  # the grid 8, 16, 32, 64 misses everywhere
    answer = search(evaluate, 8.0, 64.0, points=4, refine=2, extend=3)
    assert evaluate.calls[:6] == [8.0, 16.0, 32.0, 64.0, 4.0, 2.0]  # 2 req/s met: stop there
    low, high = answer.bracket
    assert answer.qps == low and low <= 2.55 < high  # type: ignore[operator]
    assert "extended below capacity.qps_min to 2 req/s" in answer.note
    assert len(evaluate.calls) == 6 + 2  # then the bisection between 2 and 4


def test_the_grid_extension_is_bounded_and_says_so() -> None:
    evaluate = _curve(knee=0.01)
    answer = search(evaluate, 8.0, 64.0, points=4, refine=2, extend=2)
    assert answer.qps is None and evaluate.calls[4:] == [4.0, 2.0]
    assert "even 2 req/s misses the goals" in answer.note
    high = _curve(knee=500.0)
    above = search(high, 8.0, 64.0, points=4, refine=2, extend=2)
    assert high.calls[4:] == [128.0, 256.0] and above.qps == 256.0
    assert "extended above capacity.qps_max to 256 req/s" in above.note
    assert "raise capacity.qps_max" in above.note


def test_latency_agreement_compares_the_curves_where_the_real_engine_met_the_goals() -> None:
    simulated = search(_curve(knee=10.0), 1.0, 64.0, points=7, refine=2)
    real = search(_curve(knee=5.0), 1.0, 64.0, points=7, refine=2)
    doc = latency_agreement(simulated, real, ("ttft_p90",))
    assert set(doc["rates"]) >= {1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0}
    assert doc["met_rates"][:3] == [1.0, 2.0, 4.0] and 8.0 not in doc["met_rates"]
    at = dict(zip(doc["rates"], doc["errors"]["ttft_p90"], strict=True))
    assert at[1.0] == 0.0  # both 50 ms below their knees
    assert at[8.0] == pytest.approx(50.0 / (50.0 + 3000.0) - 1.0, abs=1e-4)  # real past its knee
    assert doc["where_real_met"]["ttft_p90"] == {"median_abs_error": 0.0, "mean_signed_error": 0.0}


def test_the_step_band_brackets_the_answer_and_says_if_the_measure_fell_inside() -> None:
    """Three searches of a curve whose knee moves with the step time (a knee at 10 req/s with
    steps as calibrated, 10/1.1 with steps 10% slower, 10/0.9 with them 10% faster): the band
    holds the answer, each side's move is stated, and a measured capacity is judged against it."""
    answer, slower, faster = (
        search(_curve(knee=10.0 / scale), 1.0, 64.0, points=7, refine=6) for scale in (1, 1.1, 0.9)
    )
    band = band_record(0.1, answer, slower, faster)
    low, high = band["qps"]
    assert low < answer.qps < high
    assert band["moved"][0] < 0 < band["moved"][1]
    assert band["slower"]["step_time_scale"] == 1.1 and band["faster"]["step_time_scale"] == 0.9
    assert band["slower"]["binding"][0].startswith("ttft_p90 ")
    assert in_band(answer.qps, band) is True
    assert in_band(low * 0.95, band) is False and in_band(high * 1.05, band) is False
    assert in_band(None, band) is None and in_band(10.0, None) is None
    text = "\n".join(band_markdown(band, False))
    assert "10% longer" in text and "**outside**" in text
    # a 10% step error moves this knee by about 10% (1/1.1, 1/0.9): ±10% needs about ±9%
    largest = max(abs(m) for m in band["moved"])
    assert band["step_accuracy_for_10pct"] == pytest.approx(0.01 / largest, abs=1e-4)
    assert 0.07 < band["step_accuracy_for_10pct"] < 0.11
    # the faster search still met the goals at its top: open above
    open_band = band_record(0.1, answer, slower, search(_curve(100.0), 1.0, 8.0, 4, 2))
    assert open_band["open_above"] and in_band(1e6, open_band) is True
    assert band_cells(open_band).endswith("8+")
    # every search met the goals at its top (a fleet under the default capacity.qps_max): each
    # side is a lower bound, said so, and no move is read off a lower bound
    top = search(_curve(100.0), 1.0, 8.0, 4, 2)
    censored = band_record(0.1, top, top, top)
    assert censored["moved"] == [None, None] and censored["step_accuracy_for_10pct"] is None
    said = "\n".join(band_markdown(censored, None))
    assert "would be 8 req/s or more; 10% shorter, 8 req/s or more**" in said
    assert "+0%" not in said and band_cells(censored) == "8+ – 8+"


def test_the_step_band_must_be_a_fraction() -> None:
    for bad in (-0.1, 1.0, float("inf")):
        with pytest.raises(ConfigError, match=r"capacity\.step_band=.* fraction in \[0, 1\)"):
            CapacityOptions(step_band=bad)
    assert CapacityOptions(step_band=0).step_band == 0
