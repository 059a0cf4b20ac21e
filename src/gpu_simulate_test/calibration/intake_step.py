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
TOLERANCE_MS = 1e-4
""":func:`fit` stops where a pass moves the term by less."""
MAX_PASSES = 50
"""Passes :func:`fit` reads the term at most (each leaves the error a fraction of the last's:
the taking steps' share of the stretch: 0.26–0.37 on nine calibrations of the default fidelity
campaign, 2026-12-06)."""


def extra_ms(
    body_s: np.ndarray, modelled_s: np.ndarray, busy: np.ndarray, taking: np.ndarray
) -> float:
    """The busy steps that take a request in (``taking``): their mean time beyond
    ``modelled_s`` less the other busy steps' (ms); 0 with fewer than :data:`MIN_STEPS` of
    either."""
    ok = busy & np.isfinite(modelled_s) & np.isfinite(body_s)
    beyond = np.asarray(body_s, dtype=float) - np.asarray(modelled_s, dtype=float)
    taken, quiet = ok & taking, ok & ~taking
    if taken.sum() < MIN_STEPS or quiet.sum() < MIN_STEPS:
        return 0.0
    return float(np.mean(beyond[taken]) - np.mean(beyond[quiet])) * 1e3


def fit(
    body_s: np.ndarray,
    modelled: Callable[[np.ndarray], np.ndarray],
    busy: np.ndarray,
    taking: np.ndarray,
) -> float:
    """:func:`extra_ms` read again until it settles (:data:`TOLERANCE_MS`), each pass against
    ``modelled`` (each step's modelled time, the rates' stretch fitted on the steps it is given)
    of the steps without the last pass's term: the first pass reads it against a stretch that
    still carries it, low by the taking steps' share of that stretch; 0 where a pass reads
    none."""
    step_ms = 0.0
    for _ in range(MAX_PASSES):
        without = np.asarray(body_s, dtype=float) - step_ms / 1e3 * (busy & taking)
        again = extra_ms(body_s, modelled(without), busy, taking)
        if not again:
            return 0.0
        settled, step_ms = abs(again - step_ms) < TOLERANCE_MS, again
        if settled:
            break
    return step_ms
