"""A busy step's spread from the calibration's own busy steps, per band of decodes (issue 64):
the residuals are kept per band, a band with too few steps borrows its neighbour's, and a
simulation with ``vidur.busy_spread`` draws each busy step's fast part from its band, seeded,
with a mean of one, while wake-ups keep their time."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from gpu_simulate_test.calibration import busy_spread, serving_load
from gpu_simulate_test.simulator.step_model import PredictorClock
from gpu_simulate_test.simulator.types import Composition
from tests.unit.calibration.test_serving_load import planted
from tests.unit.calibration.test_wake import LOAD, _timer


def test_the_residuals_are_kept_per_band_and_a_thin_band_borrows() -> None:
    """Up to 8 decodes: 40 steps near 0; 9-16: 5 steps (too few: the band below's); 17-24: 40
    steps with a stall each tenth; 25 and more: none (the band below's)."""
    rng = np.random.default_rng(0)
    decodes = np.concatenate([np.full(40, 4), np.full(5, 12), np.full(40, 20)])
    tail = np.where(np.arange(40) % 10 == 0, 1.5, 0.0)
    values = np.concatenate([rng.normal(0, 0.05, 45), tail + rng.normal(0, 0.05, 40)])
    got = busy_spread.residuals(decodes, values)
    assert len(got) == len(busy_spread.DECODE_BANDS) - 1
    assert got[1] == got[0] and got[3] == got[2]
    assert len(got[0]) == 40 and list(got[0]) == sorted(got[0])
    assert max(got[0]) < 0.3 and sum(v > 1.0 for v in got[2]) == 4
    assert busy_spread.residuals(decodes[:10], values[:10]) == ()


def test_the_fit_reads_the_busy_steps_beyond_the_stretch() -> None:
    """The planted steps spread 2% around their rate's stretch: per band the residuals centre
    near 0 with that spread; without decodes in the features nothing is kept."""
    frame, pred, group = planted()
    assert serving_load.fit(frame, pred, group).busy_residual == ()
    frame["decodes"] = np.random.default_rng(1).integers(0, 32, len(frame))
    got = serving_load.fit(frame, pred, group).busy_residual
    assert len(got) == 4
    for values in got:
        assert abs(np.median(values)) < 0.01
        assert np.std(values) == pytest.approx(0.02, abs=0.005)


def _decode_steps(load: serving_load.ServingLoad, seed: int, decodes: int) -> list[float]:
    clock = PredictorClock(_timer(), load, seed=seed)
    chunks = tuple((1, 65) for _ in range(decodes))
    return [
        clock.body(0, Composition(0, 0, decodes, decodes, chunks, 0.01 * k)) for k in range(4000)
    ]


def test_a_busy_step_draws_its_bands_tail_with_a_mean_of_one() -> None:
    """Band 0 near 0, band 2 with a stall each tenth (+1.5 in log): a step of 20 decodes stalls
    about a tenth of the time, one of 4 never; the mean over the calibration's steps stays the
    lognormal's (one), and the draws are seeded."""
    calm = tuple(sorted(np.random.default_rng(2).normal(0, 0.05, 100)))
    stalls = tuple(sorted(v + (1.5 if k % 10 == 0 else 0.0) for k, v in enumerate(calm)))
    load = replace(LOAD, noise_slow_share=0.0, busy_residual=(calm, calm, stalls, stalls))
    lognormal = replace(LOAD, noise_slow_share=0.0)
    many = np.array(_decode_steps(load, 5, 20))
    few = np.array(_decode_steps(load, 5, 4))
    median = np.median(many)
    assert np.mean(many > 3 * median) == pytest.approx(0.1, abs=0.03)
    assert np.mean(few > 1.5 * np.median(few)) == 0
    assert np.mean(_decode_steps(lognormal, 5, 20) > 3 * median) == 0
    draws = busy_spread.Draws(load.busy_residual, 0.0, 5)
    pooled = [draws(4) for _ in range(20000)] + [draws(20) for _ in range(20000)]
    assert np.mean(pooled) == pytest.approx(1.0, abs=0.02)  # equal counts: the pooled mean
    assert _decode_steps(load, 5, 20) == list(many)
    assert _decode_steps(load, 6, 20) != list(many)


def test_a_wake_up_keeps_its_time_with_the_busy_spread() -> None:
    """The busy spread acts on busy steps alone: a step that wakes the engine is unchanged."""
    calm = tuple(np.linspace(-0.1, 0.1, 50))
    load = replace(LOAD, busy_residual=(calm, calm, calm, calm))

    def woken(model: serving_load.ServingLoad) -> list[float]:
        clock = PredictorClock(_timer(), model, seed=3)
        return [
            clock.body(0, Composition(1, 64, 0, 0, ((64, 64),), 0.5 * k, 0.3)) for k in range(20)
        ]

    assert woken(load) == woken(LOAD)
