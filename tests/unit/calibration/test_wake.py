"""The wake-up's spread (issue 64): the calibration's wake-ups beyond the curve are kept, and a
simulation with ``vidur.wake_spread`` draws one per step that wakes the engine, seeded, while
every busy step keeps its time."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpu_simulate_test.calibration import serving_load, wake
from gpu_simulate_test.calibration.serving_load import ServingLoad
from gpu_simulate_test.simulator.step_model import BatchTimer, PredictorClock
from gpu_simulate_test.simulator.types import Composition
from tests.unit.calibration.test_serving_load import planted


def test_the_fit_keeps_the_wake_ups_beyond_the_curve() -> None:
    """Planted wake-ups of 1 + 0.5 ms per decade of idle plus a spread of ±0.8 ms (uniform): the
    residuals are what each took beyond the fitted curve at its own idle, so they spread as
    planted, centred near 0 and sorted; without the spread they are near 0."""
    frame, pred, group = planted()
    idle = frame["idle_ms"].to_numpy()
    woke = idle > 0
    spread = np.random.default_rng(7).uniform(-0.8, 0.8, len(frame))
    frame["body_s"] = np.where(woke, frame["body_s"] + spread / 1e3, frame["body_s"])
    load = serving_load.fit(frame, pred, group)
    residual = np.asarray(load.wake_residual_ms)
    assert len(residual) == np.count_nonzero(woke)
    assert list(residual) == sorted(residual)
    assert abs(np.median(residual)) < 0.15
    assert np.percentile(residual, 10) == pytest.approx(-0.64, abs=0.2)
    assert np.percentile(residual, 90) == pytest.approx(0.64, abs=0.2)
    tight = serving_load.fit(*planted()).wake_residual_ms
    assert np.percentile(np.abs(tight), 90) < 0.2  # the curve's own misfit only


def test_the_residuals_are_the_extra_beyond_the_curve_at_each_idle() -> None:
    def line(idle_s: float) -> float:
        return 1e-3 * np.log10(max(1.0, idle_s * 1e3))

    got = wake.residuals(np.array([1.0, 10.0, 100.0]), np.array([0.5, 0.5, 2.5]), line)
    assert got == pytest.approx((-0.5, 0.5, 0.5))


def _timer() -> BatchTimer:
    def base(shape: Any, _: int) -> Any:
        return SimpleNamespace(total_time=2e-3 + 1e-5 * sum(shape.num_q_tokens))

    return BatchTimer(base, granularity=16)


LOAD = ServingLoad(
    rate_points=(1.0,),
    stretch_points=(1.0,),
    gap_points_ms=(0.0,),
    wake_idle_ms=(10.0, 300.0),
    wake_points_ms=(0.0, 4.0),
    noise_sigma=0.1,
    noise_slow_share=0.5,
    noise_phi=0.8,
)


def test_a_wake_up_draws_its_spread_and_a_busy_step_keeps_its_time() -> None:
    """Steps alternate: a prompt after 300 ms idle, then a busy decode. On the curve every
    wake-up takes the same; with the residuals each is the curve plus one of them (seeded:
    the same seed, the same draws), and the busy steps are bit for bit the same (the draws
    come from their own stream)."""
    residual = (-1.0, 0.0, 2.0)
    spread, curve = replace(LOAD, wake_residual_ms=residual), LOAD

    def run(load: ServingLoad, seed: int) -> tuple[list[float], list[float]]:
        clock = PredictorClock(_timer(), load, seed=seed)
        woken, busy = [], []
        for k in range(60):
            start = 0.5 * k
            woken.append(clock.body(0, Composition(1, 64, 0, 0, ((64, 64),), start, 0.3)))
            busy.append(clock.body(0, Composition(0, 0, 1, 1, ((1, 65),), start + 0.01)))
        return woken, busy

    on_curve, busy_curve = run(curve, 3)
    drawn, busy_drawn = run(spread, 3)
    assert len(set(on_curve)) == 1
    assert sorted({round((d - on_curve[0]) * 1e3, 9) for d in drawn}) == list(residual)
    assert busy_drawn == busy_curve
    assert run(spread, 3)[0] == drawn and run(spread, 4)[0] != drawn
