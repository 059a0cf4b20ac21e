"""A busy step's spread beyond the serving terms, per band of the requests it decodes: the
calibration's own residuals, their right tail included.

The serving terms' noise (:meth:`.serving_load.ServingLoad.noise`) is a lognormal in log time,
symmetric around the model. A busy engine's steps are not: on the calibration replays of three
default fidelity campaigns (2026-12-04, tiny Qwen3, 2 CPU cores) a busy step's log time beyond
the model lay at a median of -0.05..-0.08, its 90th percentile at +0.21..+0.28 and its 99th at
+0.49..+1.2; and the stalls (a step more than 10 ms beyond the model, two to five times its
time) came only with many requests in flight: none among the steps of up to 8 decodes, 1-8% of
those of more than 16. Near the knee one stall fills the batch to its cap and the queue behind
it (a 110 ms step at 85% of capacity in campaign q, in the truth and its repeat alike, was the
whole of the engine's TPOT p90 shortfall there). A lognormal of the same spread gives no stall.

:func:`residuals` keeps the calibration's busy steps' log residuals per band of decodes
(:data:`DECODE_BANDS`); :class:`Draws` draws a busy step's fast part from its band's
(``vidur.busy_spread``), seeded, while the slow part carries over as fitted.
"""

from __future__ import annotations

import math

import numpy as np

DECODE_BANDS: tuple[float, ...] = (0.0, 9.0, 17.0, 25.0, math.inf)
"""The bands of a step's decoding requests the spread is read in (each from its value up to
the next): up to 8, 9-16, 17-24, 25 and more."""
MIN_BAND_STEPS = 30
"""Busy steps a band needs to be drawn from; one with fewer draws from the nearest band below
that has them (above, for the lowest)."""
SEED_STREAM = 0x62757379
"""Mixed into a clock's seed for its busy-step draws (apart from the slow part's and the
wake-ups')."""


def band_of(decodes: np.ndarray | float) -> np.ndarray:
    """Each step's band (:data:`DECODE_BANDS`) by its decoding requests."""
    return np.searchsorted(np.asarray(DECODE_BANDS), decodes, side="right") - 1


def residuals(decodes: np.ndarray, log_residual: np.ndarray) -> tuple[tuple[float, ...], ...]:
    """Per band (:data:`DECODE_BANDS`), the busy steps' log time beyond the model, sorted; a
    band with fewer than :data:`MIN_BAND_STEPS` takes the nearest band's that has them; empty
    when no band has them."""
    band = band_of(np.asarray(decodes, dtype=float))
    values = np.asarray(log_residual, dtype=float)
    own = [np.sort(values[band == b]) for b in range(len(DECODE_BANDS) - 1)]
    enough = [b for b, v in enumerate(own) if len(v) >= MIN_BAND_STEPS]
    if not enough:
        return ()
    out = []
    for b in range(len(own)):
        below = [e for e in enough if e <= b]
        source = below[-1] if below else enough[0]
        out.append(tuple(float(v) for v in own[source]))
    return tuple(out)


class Draws:
    """Per busy step, the factor its fast part takes: one of its band's :func:`residuals` at
    random, its spread around the band's mean narrowed to the fast part's share of the variance
    (``slow_share``: the slow part, drawn apart, holds the rest), over the mean of all bands'
    factors (the serving terms' stretch carries the steps' mean); seeded by the clock's seed
    (:data:`SEED_STREAM` apart)."""

    def __init__(
        self, residual: tuple[tuple[float, ...], ...], slow_share: float, seed: int
    ) -> None:
        keep = math.sqrt(max(0.0, 1.0 - slow_share))
        factors = {}
        for values in residual:  # a band that took another's: the same values, once
            v = np.asarray(values, dtype=float)
            factors[values] = np.exp(v.mean() + keep * (v - v.mean()))
        mean = float(np.mean(np.concatenate(list(factors.values()))))
        self._factors = [factors[values] / mean for values in residual]
        self._rng = np.random.default_rng([SEED_STREAM, seed])

    def __call__(self, decodes: int) -> float:
        factors = self._factors[min(int(band_of(decodes)), len(self._factors) - 1)]
        return float(factors[self._rng.integers(len(factors))])
