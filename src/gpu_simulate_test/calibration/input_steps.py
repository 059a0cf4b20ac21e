"""The way in fitted through the engine's own steps (calibration version 15, issue 64).

A request sent while the engine runs reaches the engine core's input and waits there for the
step in progress: the engine takes new requests only between steps, and stamps them then. Its
hop (send to the engine's input) is therefore only known to lie in a window: after the send and
the step's start, before the step's end. :func:`~.frontend.hop_s` takes the window's middle,
which overestimates the hop the longer the steps are (a constant 3 ms hop through back-to-back
steps reads 3.6 ms at 7 ms steps, 4.2 ms at 10 ms and 6.6 ms at 20 ms), so a line through those
readings grows with the requests running because the steps do, and the simulation, which holds
each request for its own step in progress, counted that wait twice.

:func:`fit_through_steps` fits the line the way the simulation uses it instead: each request's
hop from the line, sent through the recorded steps (held to the end of a step it arrives in,
queued on arrival between steps), and the line whose queueing times come closest to the engine's
own stamps (least mean absolute error over a grid of lines). On a fresh campaign's real runs at
50% and 85% of capacity it reads 2.7 + 0.02 ms per running request and 2.8 + 0.01 where the
middle of the window read 2.8 + 0.21 and 4.3 + 0.18.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_simulate_test.calibration.overhead import running_max

COARSE_MS = 0.25
"""The first grid's step for the line's intercept (ms); its slope's is a fifth of it."""
FINE_STEPS = 10
"""Each coarse step is searched again in this many finer ones around the coarse best."""
MAX_INTERCEPT_MS = 20.0
MAX_SLOPE_MS = 2.5
MIN_BUSY_REQUESTS = 20
"""Fewer requests sent to a busy engine than this: no fit (the window's middle stays)."""


def queued_at(arrival_s: np.ndarray, spans: np.ndarray) -> np.ndarray:
    """When the engine queues requests reaching its input at ``arrival_s``: one arriving inside
    a step (``start <= t < end``; ``spans``: (start, end) rows in time order) at that step's end,
    any other on arrival."""
    arrival = np.asarray(arrival_s, dtype=float)
    if not len(spans):
        return arrival
    k = np.clip(np.searchsorted(spans[:, 1], arrival, side="right"), 0, len(spans) - 1)
    inside = (arrival >= spans[k, 0]) & (arrival < spans[k, 1])
    queued: np.ndarray = np.where(inside, spans[k, 1], arrival)
    return queued


@dataclass(frozen=True)
class ThroughSteps:
    """The line fitted through the steps and how close it comes (milliseconds)."""

    input_ms: float
    input_per_running_ms: float
    mean_abs_error_ms: float
    """Its queueing times against the engine's stamps, mean absolute difference."""
    midpoint_mean_abs_error_ms: float
    """The same for the line through the windows' middles it replaces."""
    requests: int

    def to_dict(self) -> dict[str, float | int]:
        return {
            "mean_abs_error_ms": round(self.mean_abs_error_ms, 4),
            "midpoint_mean_abs_error_ms": round(self.midpoint_mean_abs_error_ms, 4),
            "requests": self.requests,
        }


def fit_through_steps(
    sent_s: np.ndarray,
    queued_s: np.ndarray,
    running: np.ndarray,
    spans: np.ndarray,
    midpoint: tuple[float, float],
    running_max: float = float("inf"),
) -> ThroughSteps | None:
    """The line ``input_ms + input_per_running_ms · min(running, running_max)`` (ms, both >= 0)
    whose hops, sent through ``spans`` (the recorded steps, (start, end) rows, seconds), put the
    requests' queueing closest to ``queued_s`` (the engine's stamps): a coarse grid, then a finer
    one around its best. ``midpoint``: the line it replaces, scored the same way. None under
    :data:`MIN_BUSY_REQUESTS` requests."""
    sent = np.asarray(sent_s, dtype=float)
    queued = np.asarray(queued_s, dtype=float)
    if len(sent) < MIN_BUSY_REQUESTS:
        return None
    ordered = np.asarray(spans, dtype=float)
    ordered = ordered[np.argsort(ordered[:, 1], kind="stable")] if len(ordered) else ordered
    at = np.minimum(np.asarray(running, dtype=float), running_max)

    def error(a_ms: float, b_ms: float) -> float:
        hops = (a_ms + b_ms * at) / 1e3
        return float(np.mean(np.abs(queued_at(sent + hops, ordered) - queued)))

    def search(a_grid: np.ndarray, b_grid: np.ndarray) -> tuple[float, float, float]:
        return min((error(a, b), float(a), float(b)) for a in a_grid for b in b_grid)

    step = COARSE_MS
    _, a, b = search(np.arange(0.0, MAX_INTERCEPT_MS, step), np.arange(0.0, MAX_SLOPE_MS, step / 5))
    fine = step / FINE_STEPS
    a_grid = np.clip(np.arange(a - step, a + step + fine / 2, fine), 0.0, None)
    b_grid = np.clip(np.arange(b - step / 5, b + step / 5 + fine / 10, fine / 5), 0.0, None)
    best, a, b = search(np.unique(a_grid), np.unique(b_grid))
    return ThroughSteps(
        input_ms=a,
        input_per_running_ms=b,
        mean_abs_error_ms=1e3 * best,
        midpoint_mean_abs_error_ms=1e3 * error(*midpoint),
        requests=len(sent),
    )


def through_steps(
    line: dict[str, Any],
    sent_s: Sequence[float],
    queued_s: Sequence[float],
    running: Sequence[int],
    spans: np.ndarray,
) -> dict[str, Any]:
    """``line`` (:func:`~.frontend.input_line`'s) with its line fitted again through the
    recorded steps (:func:`fit_through_steps`, on the sends to a busy engine where the idle ones
    are read apart), the line through the windows' middles kept beside (``input_midpoint``) and
    how close each comes (``input_through_steps``); unchanged with too few sends to fit."""
    at = np.asarray(running, dtype=int)
    busy = at > 0 if "input_idle_ms" in line else np.ones(len(at), dtype=bool)
    midpoint = (float(line["input_ms"]), float(line["input_per_running_ms"]))
    fitted = fit_through_steps(
        np.asarray(sent_s, dtype=float)[busy],
        np.asarray(queued_s, dtype=float)[busy],
        at[busy],
        spans,
        midpoint,
        running_max(line["measured_input_ms"]),
    )
    if fitted is None:
        return line
    return {
        **line,
        "input_ms": round(fitted.input_ms, 4),
        "input_per_running_ms": round(fitted.input_per_running_ms, 4),
        "input_midpoint": {"input_ms": midpoint[0], "input_per_running_ms": midpoint[1]},
        "input_through_steps": fitted.to_dict(),
    }
