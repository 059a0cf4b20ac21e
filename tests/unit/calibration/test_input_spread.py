"""The front end's way in, spread as measured (issue 64, the p90 tail): the calibration keeps the
replays' hops around the input line as quantiles per load, the front end reads them back
(refusing a bad record by name), and each simulated request draws its level once, seeded, and
reads it off the spread at the load it was sent into."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_simulate_test.calibration.frontend import input_line
from gpu_simulate_test.calibration.input_spread import (
    SPREAD_LEVELS,
    read_quantiles,
    spread_levels,
    spread_s,
)
from gpu_simulate_test.calibration.overhead import FrontEnd
from gpu_simulate_test.vidur_simulate.inputs import input_spread

WHERE = "meta.json: engine_calibration.vllm.frontend"


def test_the_input_line_keeps_the_hops_spread_around_it_per_load() -> None:
    rng = np.random.default_rng(0)
    running = rng.integers(0, 4, 4000)
    slow = rng.random(4000) < np.where(running >= 2, 0.2, 0.0)  # busier: one in five held up
    hops = 5.0 + 0.5 * running + rng.normal(0, 0.2, 4000) + np.where(slow, 10.0, 0.0)
    line = input_line(running.tolist(), hops.tolist())
    spread = line["input_residual_ms"]
    assert set(spread) == {"0", "1", "2"}  # 2 and 3 running share a bucket
    assert all(len(q) == len(SPREAD_LEVELS) and q == sorted(q) for q in spread.values())
    assert spread["0"][-2] < 1.0  # quiet: the 95th within a millisecond of the line
    assert spread["2"][-2] > 7.0  # busier: the slow fifth
    few = input_line([0] * 30 + [5] * 5, [5.0] * 35)["input_residual_ms"]
    assert set(few) == {"0"}  # a bucket with too few hops is not kept


def test_the_front_end_reads_the_spread_and_names_a_bad_one() -> None:
    q = [round(-1.0 + 0.25 * k, 2) for k in range(len(SPREAD_LEVELS))]
    recorded = {"input_ms": 5, "output_ms": 1.5, "input_residual_ms": {"4": q, "0": q}}
    front = FrontEnd.from_calibration(recorded, WHERE)
    assert front.input_residual_ms == ((0, tuple(q)), (4, tuple(q)))
    assert FrontEnd.from_calibration({"input_ms": 5, "output_ms": 1}, WHERE).input_residual_ms == ()
    for bad in ({"0": q[:-1]}, {"0": [*q[:-1], "x"]}, {"0": [*q[:-1], float("nan")]}, {"x": q}):
        with pytest.raises(ValueError, match=r"frontend\.input_residual_ms\.\w+: expected a"):
            FrontEnd.from_calibration({**recorded, "input_residual_ms": bad}, WHERE)
    with pytest.raises(ValueError, match=r"input_residual_ms\.0: expected increasing"):
        FrontEnd.from_calibration({**recorded, "input_residual_ms": {"0": q[::-1]}}, WHERE)
    with pytest.raises(ValueError, match=r"input_residual_ms: expected a mapping"):
        FrontEnd.from_calibration({**recorded, "input_residual_ms": q}, WHERE)


def test_each_request_reads_its_level_off_the_spread_of_its_load() -> None:
    quiet = tuple(0.0 for _ in SPREAD_LEVELS)
    measured = np.r_[np.zeros(90), np.full(10, 12.0)]  # busy: one hop in ten 12 ms above
    busy = tuple(float(np.quantile(measured, level)) for level in SPREAD_LEVELS)
    front = FrontEnd(5.0, 1.0, input_residual_ms=((0, quiet), (2, busy)))
    levels = spread_levels(20000, seed=3)
    assert np.array_equal(levels, spread_levels(20000, seed=3))
    assert not np.array_equal(levels, spread_levels(20000, seed=4))
    spread = front.input_residual_ms
    assert not spread_s(spread, levels, np.zeros(20000)).any()  # quiet: on the line
    drawn = spread_s(spread, levels, np.full(20000, 7.0)) * 1000.0  # 7: the bucket from 2
    assert np.quantile(drawn, 0.5) == pytest.approx(0.0, abs=1e-9)
    assert 0.08 < float(np.mean(drawn > 6.0)) < 0.12  # about one in ten, as measured
    assert drawn.max() <= 12.0 and drawn.min() >= 0.0
    assert not spread_s(FrontEnd(5.0, 1.0).input_residual_ms, levels[:7], np.ones(7)).any()


def test_the_spread_applies_where_it_can_and_says_why_not() -> None:
    from gpu_simulate_test.config.vidur import VidurConfig

    assert VidurConfig().frontend_input_spread is False  # measured, not the default (docs)
    q = tuple(float(k) for k in range(len(SPREAD_LEVELS)))
    front = FrontEnd(5.0, 1.0, input_residual_ms=((0, q),))
    assert input_spread(front, enabled=False, by_queue=False, count=4, seed=0) == (None, "off")
    levels, note = input_spread(front, enabled=True, by_queue=False, count=4, seed=0)
    assert levels is not None and np.array_equal(levels, spread_levels(4, 0))
    assert note == "drawn (seed 0)"
    for args in ((front, True), (None, False), (FrontEnd(5.0, 1.0), False)):
        levels, note = input_spread(args[0], enabled=True, by_queue=args[1], count=4, seed=0)
        assert levels is None and note.startswith("none: ")


def test_the_idle_spread_needs_the_idle_sends_spread_and_says_so() -> None:
    from gpu_simulate_test.config.vidur import VidurConfig

    assert VidurConfig().frontend_idle_spread is True
    q = tuple(float(k) for k in range(len(SPREAD_LEVELS)))
    idle = FrontEnd(5.0, 1.0, input_residual_ms=((0, q), (4, q)))
    levels, note = input_spread(idle, enabled=False, by_queue=False, count=4, seed=1, idle=True)
    assert levels is not None and np.array_equal(levels, spread_levels(4, 1))
    assert note == "drawn (seed 1, the sends to an idle engine)"
    busy_only = FrontEnd(5.0, 1.0, input_residual_ms=((4, q),))
    levels, note = input_spread(
        busy_only, enabled=False, by_queue=False, count=4, seed=1, idle=True
    )
    assert levels is None and "too few sends to an idle engine" in note
    levels, note = input_spread(busy_only, enabled=True, by_queue=False, count=4, seed=1, idle=True)
    assert levels is not None and note == "drawn (seed 1)"  # every load: the idle sends too


def test_the_tail_goes_on_beyond_the_99th_as_an_exponential_and_only_with_tail() -> None:
    measured = np.random.default_rng(5).exponential(2.0, 400_000)  # an exponential: mean 2 ms
    kept = tuple(float(np.quantile(measured, level)) for level in SPREAD_LEVELS)
    levels = spread_levels(400_000, seed=9)
    clamped = read_quantiles(levels, kept, tail=False)
    tailed = read_quantiles(levels, kept, tail=True)
    below = levels <= SPREAD_LEVELS[-1]
    assert np.array_equal(clamped[below], tailed[below])  # the kept quantiles read alike
    assert clamped.max() == kept[-1]  # without: nothing beyond the 99th percentile
    top = ~below
    assert tailed[top].min() >= kept[-1] and tailed[top].max() > 2 * kept[-1]
    # an exponential's top 1% lies on average one mean (2 ms) above its 99th percentile
    assert float(np.mean(tailed[top]) - kept[-1]) == pytest.approx(2.0, rel=0.1)
    assert np.all(clamped[top] == kept[-1])
    assert np.quantile(tailed, 0.999) == pytest.approx(np.quantile(measured, 0.999), rel=0.05)
    # any kept quantiles: the rise from the 95th to the 99th, per e-fold of what lies beyond
    skewed = tuple(float(np.exp(2.0 * level**3)) for level in SPREAD_LEVELS)
    rise = (skewed[-1] - skewed[-2]) / np.log(0.05 / 0.01)
    beyond = read_quantiles(np.array([0.99, 0.999, 0.9999]), skewed, tail=True)
    assert beyond == pytest.approx([skewed[-1], skewed[-1] + rise * np.log(10.0),
                                    skewed[-1] + rise * np.log(100.0)])  # fmt: skip
    # per bucket, in seconds, as the simulation reads it
    front = ((0, kept),)
    at = np.zeros(len(levels))
    assert np.array_equal(spread_s(front, levels, at, tail=True), tailed / 1000.0)
    assert np.array_equal(spread_s(front, levels, at), clamped / 1000.0)


def test_without_a_front_end_the_note_says_so() -> None:
    # every run without a calibrated front end (the stage's default, vidur.engine_overhead=
    # none) recorded "it spreads the calibrated line (vidur.frontend_input=line)": the setting
    # it already had, not why nothing was drawn
    for enabled, idle in ((True, False), (False, True)):
        levels, note = input_spread(None, enabled, by_queue=False, count=4, seed=0, idle=idle)
        assert levels is None and note.startswith("none: no front end's way in")
    q = tuple(float(k) for k in range(len(SPREAD_LEVELS)))
    front = FrontEnd(5.0, 1.0, input_residual_ms=((0, q),))
    _, note = input_spread(front, enabled=True, by_queue=True, count=4, seed=0)
    assert note == "none: it spreads the calibrated line (vidur.frontend_input=line)"
