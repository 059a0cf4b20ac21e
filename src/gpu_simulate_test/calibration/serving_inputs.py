"""What the serving terms' fit reads from the calibration replays' steps, read once.

:func:`~.serving_load.fit` and the benchmarks that read its terms again (the sends' intake
against the stretch without it: ``benchmarks/calibration/bench_intake_reading.py``) take the
same inputs from a step table's features (:func:`~.serving_load.step_features`) and each step's
prediction: each step's time clipped to :data:`RATIO_CLIP` of its prediction, the busy steps
with a prediction, the pauses, the steps that take a request in, the sends beside each step and
their offsets. They are read here, once, so that a reading apart from the fit reads what the fit
reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import intake_phase

CLIENT_SENDS = "client_sends"
"""``serving_steps.csv``'s column and the step feature: requests the client sent while the step
ran."""
RATIO_CLIP = (0.25, 4.0)
"""A step's ratio is clipped to this range before fitting (a preempted or disturbed step)."""


@dataclass(frozen=True, eq=False)
class FitInputs:
    """The replays' steps as the serving terms' fit reads them, one entry per step."""

    body: np.ndarray
    """The step's time (s), its ratio to its prediction clipped to :data:`RATIO_CLIP`; 0 where
    it has no prediction."""
    length_ms: np.ndarray
    """The step's time as recorded (ms, unclipped): where in it a send fell."""
    pred: np.ndarray
    """The step's predicted time from its composition alone (s)."""
    req: np.ndarray
    """Requests the engine took in per second over the window before the step."""
    busy: np.ndarray
    """Busy (not waking an idle engine) and predicted."""
    labels: np.ndarray
    """Which rate the step's replay ran at (0 for all: one rate)."""
    pauses: tuple[np.ndarray, np.ndarray]
    """The pause before the step (ms) and whether the step takes a request in."""
    sends: np.ndarray
    """Requests the client sent while the step ran (NaN: not recorded)."""
    offsets: Sequence[np.ndarray] | None
    """Where in the step each send fell (:func:`~.intake_phase.step_offsets`; None: not
    recorded)."""

    @property
    def predicted(self) -> np.ndarray:
        """Whether the step has a prediction (finite and positive)."""
        return np.isfinite(self.pred) & (self.pred > 0)

    def late(self, free_ms: float) -> np.ndarray:
        """Each step's sends that add their intake past the step's free part."""
        return late(self.offsets, self.sends, free_ms)


def fit_inputs(
    features: pd.DataFrame, predicted_s: np.ndarray, groups: np.ndarray | None = None
) -> FitInputs:
    """The fit's inputs from the steps' features, their predictions and the rate each step's
    replay ran at (``groups``; None: one rate)."""
    body = features["body_s"].to_numpy(dtype=float)
    pred = np.asarray(predicted_s, dtype=float)
    ok = np.isfinite(pred) & (pred > 0)
    ratio = np.clip(body / np.where(ok, pred, 1.0), *RATIO_CLIP)
    taking = (
        features["arrivals"].to_numpy(dtype=int) > 0
        if "arrivals" in features
        else np.zeros(len(features), dtype=bool)
    )
    return FitInputs(
        body=np.where(ok, ratio * np.where(ok, pred, 0.0), 0.0),  # clipped outliers
        length_ms=body * 1e3,
        pred=pred,
        req=features["arrival_rate"].to_numpy(dtype=float),
        busy=features["busy"].to_numpy(dtype=bool) & ok,
        labels=np.zeros(len(features)) if groups is None else np.asarray(groups, dtype=float),
        pauses=(features["gap_s"].to_numpy(dtype=float) * 1e3, taking),
        sends=sends(features),
        offsets=intake_phase.step_offsets(features),  # parsed once: the fit and the late sends
    )


def replay_rates(serving_steps: pd.DataFrame) -> np.ndarray:
    """Each calibration replay step's rate (req/s), the replays in their order of appearance
    and each replay's steps in order: the order their features are concatenated in."""
    parts = [p for _, p in serving_steps.groupby("replay", sort=False)]
    return pd.concat(parts, ignore_index=True)["rate_qps"].to_numpy(dtype=float)


def late(offsets: Sequence[np.ndarray] | None, sends: np.ndarray, free_ms: float) -> np.ndarray:
    """Each step's sends that add their intake: those past the free part where the offsets
    were recorded (:func:`~.intake_phase.step_offsets`), else all of them (0 where none were
    recorded)."""
    if offsets is not None:
        return intake_phase.late_sends(offsets, free_ms)
    return np.where(np.isfinite(sends), sends, 0.0)


def sends(steps: pd.DataFrame) -> np.ndarray:
    """Each step's requests sent while it ran, from a step table or its features (NaN: not
    recorded)."""
    if CLIENT_SENDS not in steps.columns:
        return np.full(len(steps), np.nan)
    return steps[CLIENT_SENDS].to_numpy(dtype=float)
