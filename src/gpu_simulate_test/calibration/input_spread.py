"""The front end's input spread (``vidur.frontend_input_spread``, calibration version 12): the
calibration replays' input hops around the line, kept per bucket of requests running at the send
as quantiles (``frontend.input_residual_ms``), read back and checked, and read off per request at
a seeded level."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

SPREAD_LEVELS: tuple[float, ...] = (0.01, *(k / 20 for k in range(1, 20)), 0.99)
"""Where the front end's input spread is read: the 1st, every 5th and the 99th percentile."""
MIN_SPREAD_SAMPLES = 20
"""Readings a spread needs to be kept (a bucket of running requests' hops, the idle first
tokens' way back)."""
SPREAD_BUCKETS: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32)
"""The input spread is kept per bucket of requests running at the send: each bucket from its
value up to the next (the last: and above)."""


def spread_bucket(running: np.ndarray) -> np.ndarray:
    """Each running count's bucket (its :data:`SPREAD_BUCKETS` lower bound)."""
    edges = np.asarray(SPREAD_BUCKETS)
    index = np.searchsorted(edges, np.asarray(running, dtype=float), side="right") - 1
    return np.asarray(edges[np.maximum(index, 0)])


INPUT_SPREAD_STREAM = 64
"""The input spread's random stream beside ``vidur.seed`` (apart from the steps' draws)."""
FIRST_SPREAD_STREAM = 65
"""The idle first tokens' way-back spread's stream (apart from the way in's)."""
BUSY_HOP_STREAM = 66
"""The busy sends' way-in spread's stream (``vidur.frontend_busy_hop``; apart from the
others)."""


def spread_levels(count: int, seed: int, stream: int = INPUT_SPREAD_STREAM) -> np.ndarray:
    """``count`` seeded uniform levels, one per request, for the input spread (or another
    ``stream``)."""
    return np.random.default_rng([seed, stream]).random(count)


def residuals(
    recorded: Any,
    where: str,
    key: str = "input_residual_ms",
    what: str = "the hops' spread around the input line",
) -> tuple[tuple[int, tuple[float, ...]], ...]:
    """A spread kept per bucket of running requests (``key``: ``input_residual_ms`` or another)
    as the simulation takes it: per bucket (a count as key), one finite number per spread
    level, increasing (absent: none); ValueError naming ``where``, ``key`` and the bucket
    otherwise."""
    if recorded is None:
        return ()
    if not isinstance(recorded, dict):
        raise ValueError(
            f"{where}.{key}: expected a mapping of running counts to quantiles, got {recorded!r}"
        )
    out = []
    for bucket, values in recorded.items():
        at = f"{where}.{key}.{bucket}"
        if not str(bucket).isdigit():
            raise ValueError(f"{at}: expected a running count as key, got {bucket!r}")
        out.append((int(bucket), quantiles(values, at, what)))
    return tuple(sorted(out))


def quantiles(values: Any, at: str, what: str) -> tuple[float, ...]:
    """A kept spread: one finite number of milliseconds per :data:`SPREAD_LEVELS`, increasing;
    ValueError naming ``at`` and ``what`` it is otherwise."""
    ok = isinstance(values, list) and len(values) == len(SPREAD_LEVELS)
    numbers = ok and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if not numbers or not np.all(np.isfinite(values)):
        raise ValueError(
            f"{at}: expected a list of {len(SPREAD_LEVELS)} finite milliseconds ({what}), got "
            f"{values!r}"
        )
    if np.any(np.diff(values) < 0):
        raise ValueError(f"{at}: expected increasing quantiles, got {values!r}")
    return tuple(float(v) for v in values)


def read_quantiles(levels: np.ndarray, quantiles: Sequence[float], tail: bool) -> np.ndarray:
    """``levels`` (in [0, 1): seeded uniform draws) read off one spread's ``quantiles`` (at
    :data:`SPREAD_LEVELS`) by linear interpolation; below the first level its quantile, above
    the last one its quantile or, with ``tail``, an exponential tail through the last two kept
    quantiles (the 95th and the 99th: the same rise each time what lies beyond, ``1 - u``,
    shrinks e-fold, so a level ``u`` above the 99th reads
    ``q99 + (q99 - q95) · ln(0.01 / (1 - u)) / ln(5)``; the mean of the top 1% then lies one
    such rise above the 99th percentile instead of on it)."""
    out = np.interp(levels, SPREAD_LEVELS, quantiles)
    if not tail:
        return out
    top, below = SPREAD_LEVELS[-1], SPREAD_LEVELS[-2]
    rise = (quantiles[-1] - quantiles[-2]) / math.log((1.0 - below) / (1.0 - top))
    beyond = levels > top
    out[beyond] = quantiles[-1] + rise * np.log((1.0 - top) / (1.0 - levels[beyond]))
    return out


def spread_s(
    residuals_ms: Sequence[tuple[int, Sequence[float]]],
    levels: np.ndarray,
    running: np.ndarray,
    tail: bool = False,
) -> np.ndarray:
    """Per request, its ``levels`` read off the spread (``residuals_ms``: per bucket lower
    bound, increasing, the quantiles at :data:`SPREAD_LEVELS`) of the bucket its ``running``
    count falls in, the nearest measured below, else the lowest (seconds; zeros without one);
    ``tail``: beyond the 99th percentile on an exponential tail (:func:`read_quantiles`)."""
    out = np.zeros(len(levels))
    if not residuals_ms:
        return out
    lows = np.array([b for b, _ in residuals_ms], dtype=float)
    which = np.maximum(np.searchsorted(lows, np.asarray(running, dtype=float), "right") - 1, 0)
    levels = np.asarray(levels, dtype=float)
    for k, (_, quantiles) in enumerate(residuals_ms):
        mine = which == k
        out[mine] = read_quantiles(levels[mine], quantiles, tail)
    return out / 1000.0
