"""How fast a server's steps ran against the step model the simulation runs on.

On this project's CPU host, fresh vLLM servers differ by about 15% in step time, and one server
drifts by ±10% over tens of seconds. The simulation runs at the speed its calibration saw (the
predictor, the engine overhead and the serving terms fitted on the calibration replays); a
judged server may run faster or slower. Near a latency goal a few percent of step time move the
capacity several times as much (the capacity stage's ``step_band``), so a simulated capacity
that differs from the measured one may be the model's error or the server's speed.
:func:`step_level` says which part is the steps: the server's own steps (its ``engine_schedule``
at each rate run), each timed by the model as the simulation would time a step of that
composition at that load (:func:`~.serving_load.modelled_s`), the total measured over the total
modelled. 1.10: this server's steps took 10% longer than the simulation's steps of the same
composition and load.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import serving_load
from gpu_simulate_test.calibration.serving_load import ServingLoad

MIN_STEPS = 20
"""Busy steps a level needs (fewer: none)."""

Predict = Callable[[Sequence[tuple[int, int]]], float]
"""A step's predicted seconds from its chunks (query tokens, KV tokens after the step)."""


def busy_steps(
    schedule: pd.DataFrame, predict_s: Predict, load: ServingLoad | None
) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """One run's busy steps the model times: their features
    (:func:`~.serving_load.step_features`), measured seconds and modelled seconds (a step the
    predictor cannot time is left out)."""
    features = serving_load.step_features(schedule.reset_index(drop=True))
    predicted = serving_load.predictions(features, predict_s)
    modelled = predicted if load is None else serving_load.modelled_s(load, features, predicted)
    busy = features["busy"].to_numpy(dtype=bool) & np.isfinite(modelled) & (modelled > 0)
    body = features["body_s"].to_numpy(dtype=float)
    busy &= np.isfinite(body)
    return features[busy].reset_index(drop=True), body[busy], modelled[busy]


def run_sums(
    schedule: pd.DataFrame, predict_s: Predict, load: ServingLoad | None
) -> tuple[float, float, int]:
    """One run's busy steps: their measured seconds, their modelled seconds and their count
    (:func:`busy_steps`)."""
    _, body, modelled = busy_steps(schedule, predict_s, load)
    return float(body.sum()), float(modelled.sum()), len(body)


def step_level(
    runs: Sequence[pd.DataFrame], predict_s: Predict, load: ServingLoad | None
) -> dict[str, Any] | None:
    """The server's steps against the model over ``runs`` (each run's ``engine_schedule``):
    ``ratio`` (total measured over total modelled busy-step time), ``steps``, and each run's own
    ratio (``per_run``: how much it moved from run to run); None with fewer than
    :data:`MIN_STEPS` busy steps."""
    return level_of([run_sums(schedule, predict_s, load) for schedule in runs])


def level_of(sums: Sequence[tuple[float, float, int]]) -> dict[str, Any] | None:
    """:func:`step_level` from each run's :func:`run_sums` (so that a subset of the runs reads
    its level without timing its steps again)."""
    steps = sum(n for _, _, n in sums)
    measured = sum(b for b, _, _ in sums)
    modelled = sum(m for _, m, _ in sums)
    if steps < MIN_STEPS or modelled <= 0:
        return None
    return {
        "ratio": round(measured / modelled, 4),
        "steps": steps,
        "per_run": [round(b / m, 4) if m > 0 and n else None for b, m, n in sums],
    }
