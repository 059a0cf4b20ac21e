"""What a busy step that takes a request in takes beyond its composition's time.

vLLM's engine core does more in a step that schedules a request for the first time than its
tokens say: the request's blocks for its whole prompt, its row in the model runner's input
batch, its sampling state. On this project's CPU host the calibration replays' busy steps that
took one in ran 0.26 ms above the serving model on average where the others ran 0.03 ms below
(twenty-five calibrations, 2026-12-06; one more request in the same step adds about nothing).
The simulation's step that schedules a request for the first time, on a busy engine, adds the
difference (:attr:`~.serving_load.ServingLoad.intake_step_ms`); a step waking an idle engine
takes one in always and has it in its wake-up already.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

MIN_STEPS = 5
"""Busy steps of each kind (taking a request in, not) the difference needs."""
PROBE_MS = 1.0
"""The term :func:`fit` takes out of the steps for its second reading."""


def extra_ms(
    body_s: np.ndarray, modelled_s: np.ndarray, busy: np.ndarray, taking: np.ndarray
) -> float:
    """The busy steps that take a request in (``taking``): their mean time beyond
    ``modelled_s`` less the other busy steps' (ms); 0 with fewer than :data:`MIN_STEPS` of
    either."""
    return _read(body_s, modelled_s, busy, taking) or 0.0


def _read(
    body_s: np.ndarray, modelled_s: np.ndarray, busy: np.ndarray, taking: np.ndarray
) -> float | None:
    ok = busy & np.isfinite(modelled_s) & np.isfinite(body_s)
    beyond = np.asarray(body_s, dtype=float) - np.asarray(modelled_s, dtype=float)
    taken, quiet = ok & taking, ok & ~taking
    if taken.sum() < MIN_STEPS or quiet.sum() < MIN_STEPS:
        return None
    return float(np.mean(beyond[taken]) - np.mean(beyond[quiet])) * 1e3


def fit(
    body_s: np.ndarray,
    modelled: Callable[[np.ndarray], np.ndarray],
    busy: np.ndarray,
    taking: np.ndarray,
) -> float:
    """The term the steps give back when read against the rates' stretch fitted without it
    (``modelled``: each step's modelled time, the stretch fitted on the steps it is given); 0
    with fewer than :data:`MIN_STEPS` steps of either kind. Kept signed (a calibration's noise
    may read it below zero; over twenty calibrations it averaged above).

    Read against a stretch fitted with the term in it (:func:`extra_ms` of the steps as they
    are), the term comes out low by the part of it the stretch carries back: the taking steps'
    fraction of the busy steps times how much longer they are predicted than the others, over
    the mean prediction (0.20–0.37 on fourteen calibrations of this host, 2026-12-06). The
    stretch is linear in the steps' times, so a reading is ``a + b * t`` with ``t`` the term
    taken out first: read at 0 and at :data:`PROBE_MS`, the term is ``a / (1 - b)``; where
    ``b`` is 1 or more (no such term) the first reading."""
    body = np.asarray(body_s, dtype=float)
    first = _read(body, modelled(body), busy, taking)
    if first is None:
        return 0.0
    probe = body - PROBE_MS / 1e3 * (busy & taking)  # the same steps count: read as the first
    carried = (extra_ms(body, modelled(probe), busy, taking) - first) / PROBE_MS
    return first if carried >= 1.0 else first / (1.0 - carried)
