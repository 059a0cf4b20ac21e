"""Where in its step a send falls, and what it adds there: the API server's intake by phase.

On this project's CPU host the API server takes a request in (HTTP, parsing, tokenizing, the
hop to the engine core) on the cores the engine computes on. Measured on the three default
fidelity campaigns of 2026-12-04 (``benchmarks/results/send_phase_20261204``), a decode-only
step with one send in it against the median step of its composition: a send in the step's first
3 ms cost nothing (−0.12..+0.27 ms), one 3–5 ms in +0.70..+1.15 ms, one later +1.40..+1.74 ms
(random times in steps without a send, the length bias alone: 0.00 and +0.14..+0.37). The
step's first part (vLLM's scheduling and input preparation, Python on one core) leaves a core
free for the API server; its forward (threads on both cores) does not.

So a send adds its intake to its step only past the step's **free part** (``intake_free_ms``).
Both are read from the calibration replays' one-send busy steps (``serving_steps.csv``
``client_send_offsets_ms``: each send's offset into the step it fell in; calibration version
17 on): for each candidate free part, per replayed rate, the median time beyond the model of
the steps whose send fell past it less that of the steps without a send, these weighted by how
much of them lies past it (a random point past the free part falls in long steps more often);
the free part whose model (nothing before it, the intake after it) leaves the least absolute
error over the one-send steps answers (the candidates run while every rate keeps enough sends
past them, so each is scored on the same steps). A free part of 0 is the intake everywhere
(the model before version 17), so the fit chooses it where the phase does not matter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

CLIENT_SEND_OFFSETS = "client_send_offsets_ms"
"""``serving_steps.csv``'s column: each send's offset into the step it fell in (ms from the
step's start, ``;``-separated; empty: no send)."""
FREE_STEP_MS = 0.25
"""The candidate free parts' spacing."""
MIN_LATE_STEPS = 10
"""One-send busy steps of one rate with the send past the free part (and as many without a
send) needed for that rate to count in a candidate's intake."""


@dataclass(frozen=True)
class IntakePhase:
    """The fitted intake: what a send past its step's free part adds to the step."""

    intake_s: float
    free_ms: float
    steps: int
    """The one-send busy steps the choice was scored on."""


def format_offsets(offsets_ms: Sequence[float] | np.ndarray) -> str:
    """One step's sends' offsets as the column holds them."""
    return ";".join(f"{v:.3f}" for v in offsets_ms)


def parse_offsets(cell: object) -> np.ndarray:
    """One cell of :data:`CLIENT_SEND_OFFSETS` (empty or NaN: no send)."""
    if not isinstance(cell, str) or not cell.strip():
        return np.empty(0)
    return np.array([float(v) for v in cell.split(";")], dtype=float)


def offsets_within(sent: np.ndarray, start: np.ndarray, end: np.ndarray) -> list[str]:
    """Per step [start, end): the offsets of the sorted send times ``sent`` inside it."""
    lo = np.searchsorted(sent, start, side="left")
    hi = np.searchsorted(sent, end, side="left")
    return [format_offsets((sent[a:b] - s) * 1e3) for a, b, s in zip(lo, hi, start, strict=True)]


def step_offsets(steps: pd.DataFrame) -> list[np.ndarray] | None:
    """Each step's sends' offsets (None: the column is absent, a calibration before 17)."""
    if CLIENT_SEND_OFFSETS not in steps.columns:
        return None
    return [parse_offsets(c) for c in steps[CLIENT_SEND_OFFSETS]]


def late_sends(offsets: Sequence[np.ndarray], free_ms: float) -> np.ndarray:
    """Per step, its sends past the free part."""
    return np.array([float(np.sum(o >= free_ms)) for o in offsets])


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """The value below which half the weight lies (NaN without weight)."""
    keep = weights > 0
    if not keep.any():
        return float("nan")
    order = np.argsort(values[keep])
    v, w = values[keep][order], weights[keep][order]
    cum = np.cumsum(w)
    return float(v[np.searchsorted(cum, 0.5 * cum[-1])])


def fit(
    beyond_s: np.ndarray,
    length_ms: np.ndarray,
    busy: np.ndarray,
    offsets: Sequence[np.ndarray] | None,
    labels: np.ndarray,
    sends: np.ndarray,
) -> IntakePhase | None:
    """The intake from each step's time beyond the stretched prediction (``beyond_s``), its
    length, whether it ran busy, its sends' offsets (None: not recorded), its replayed rate and
    its sends (NaN: not recorded); None: too few one-send steps at every rate. With the
    offsets, the free part and the intake past it (:func:`by_phase`); without them, the intake
    of every send (:func:`uniform`)."""
    if offsets is None:
        return uniform(beyond_s, busy, sends, labels)
    return by_phase(beyond_s, length_ms, busy, offsets, labels)


def uniform(
    beyond_s: np.ndarray, busy: np.ndarray, sends: np.ndarray, labels: np.ndarray
) -> IntakePhase | None:
    """What one send adds to a busy step wherever it falls (calibrations 12 to 16): per replayed
    rate, the median time beyond the model of the busy steps during which the client sent one
    request less that of those during which it sent none, weighed by the one-send steps."""
    diffs, weights = [], []
    for label in np.unique(labels):
        one = busy & (labels == label) & (sends == 1)
        none = busy & (labels == label) & (sends == 0)
        if one.sum() >= MIN_LATE_STEPS and none.sum() >= MIN_LATE_STEPS:
            diffs.append(float(np.median(beyond_s[one]) - np.median(beyond_s[none])))
            weights.append(float(one.sum()))
    if not diffs:
        return None
    return IntakePhase(max(0.0, float(np.average(diffs, weights=weights))), 0.0, int(sum(weights)))


def by_phase(
    beyond_s: np.ndarray,
    length_ms: np.ndarray,
    busy: np.ndarray,
    offsets: Sequence[np.ndarray],
    labels: np.ndarray,
) -> IntakePhase | None:
    """The free part and the intake past it (:mod:`this module <.intake_phase>`)."""
    count = np.array([len(o) for o in offsets])
    first = np.array([o[0] if len(o) else np.nan for o in offsets])
    one, none = busy & (count == 1), busy & (count == 0)
    top = float(np.nanmedian(length_ms[one])) if one.any() else 0.0
    rates = [
        labels == label
        for label in np.unique(labels)
        if (one & (labels == label)).sum() >= MIN_LATE_STEPS
        and (none & (labels == label)).sum() >= MIN_LATE_STEPS
    ]
    best: tuple[float, IntakePhase] | None = None
    for free in np.arange(0.0, top, FREE_STEP_MS):  # until a rate runs short of late sends
        late = one & (first >= free)
        if not rates or any((late & ours).sum() < MIN_LATE_STEPS for ours in rates):
            break
        diffs, weights, scored = [], [], []
        for ours in rates:
            quiet, span = beyond_s[none & ours], length_ms[none & ours]
            base_late = weighted_median(quiet, np.maximum(span - free, 0.0))
            base_early = weighted_median(quiet, np.minimum(span, free)) if free > 0 else 0.0
            diffs.append(float(np.median(beyond_s[late & ours])) - base_late)
            weights.append(float((late & ours).sum()))
            scored.append((ours, base_late, base_early))
        intake = max(0.0, float(np.average(diffs, weights=weights)))
        error, steps = 0.0, 0
        for ours, base_late, base_early in scored:
            at = one & ours
            model = np.where(first[at] >= free, base_late + intake, base_early)
            error += float(np.abs(beyond_s[at] - model).sum())
            steps += int(at.sum())
        if best is None or error < best[0] - 1e-12:
            best = (error, IntakePhase(intake, float(free), steps))
    return None if best is None else best[1]
