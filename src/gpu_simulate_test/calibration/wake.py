"""What a step that wakes an idle engine takes beyond its prediction: a curve in the idle time,
and the spread around it.

On the main job's truths a prompt's step after an idle took 6.4 ms after under 20 ms, 9.6 after
100–200 and 11.2 after more than 400 ms (ten real runs, 2026-12-03), flat, then steep, then flat.
:func:`curve` reads it per band of idle time (:data:`WAKE_BANDS_MS`). Around the curve the
wake-ups of one band still spread: the truths' steps lay 0.7–1.2 ms below their band's median at
the tenth percentile and 0.7–0.9 ms above it at the ninetieth (batch B of
benchmarks/results/idle_wake_20261204), where a simulation's lay only where the curve's slope
put them. :func:`residuals` keeps the calibration's own wake-ups beyond the curve, and
:class:`Draws` draws one per simulated wake-up (``vidur.wake_spread``), seeded.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

WAKE_BANDS_MS: tuple[float, ...] = (0.0, 20.0, 50.0, 100.0, 200.0, 400.0, math.inf)
"""The bands of idle time the wake-up is read in (each from its value up to the next)."""
MIN_WAKE_STEPS = 3
"""Wake-ups a band needs to count in the wake-up's curve."""
SEED_STREAM = 0x77616B65
"""Mixed into a clock's seed for its wake-up draws (apart from the busy steps' slow moments, so
drawing them moves no other step)."""


def curve(idle_ms: np.ndarray, extra_ms: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The wake-up per band of idle time (:data:`WAKE_BANDS_MS`, each with at least
    :data:`MIN_WAKE_STEPS`): the bands' median idle and median extra time; both empty (the
    line) with fewer than two such bands."""
    band = np.searchsorted(np.asarray(WAKE_BANDS_MS), idle_ms, side="right") - 1
    idle, extra = [], []
    for b in range(len(WAKE_BANDS_MS) - 1):
        mine = band == b
        if np.count_nonzero(mine) >= MIN_WAKE_STEPS:
            idle.append(float(np.median(idle_ms[mine])))
            extra.append(float(np.median(extra_ms[mine])))
    if len(idle) < 2:
        return (), ()
    return tuple(idle), tuple(extra)


def residuals(
    idle_ms: np.ndarray, extra_ms: np.ndarray, wake_s: Callable[[float], float]
) -> tuple[float, ...]:
    """The wake-ups' extra time beyond ``wake_s`` (the fitted curve, seconds from seconds) at
    their own idle, in ms, sorted."""
    fitted = np.array([wake_s(float(ms) / 1e3) * 1e3 for ms in idle_ms])
    return tuple(sorted(float(v) for v in np.asarray(extra_ms, dtype=float) - fitted))


class Draws:
    """Per simulated wake-up, one of the calibration's :func:`residuals` (ms) at random, in
    seconds; seeded by the clock's seed (:data:`SEED_STREAM` apart)."""

    def __init__(self, residual_ms: tuple[float, ...], seed: int) -> None:
        self._values = np.asarray(residual_ms, dtype=float) / 1e3
        self._rng = np.random.default_rng([SEED_STREAM, seed])

    def __call__(self) -> float:
        return float(self._values[self._rng.integers(len(self._values))])
