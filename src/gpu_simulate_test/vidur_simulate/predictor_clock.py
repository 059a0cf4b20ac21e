"""Steps of vLLM's V1 scheduler timed by Vidur's predictor (:class:`PredictorClock`).

A step's body is Vidur's prediction of its shape with the fitted engine overhead
(:class:`~.loop_setup.BatchTimer`). Where the bundle has calibration replays under load, the
serving terms (:mod:`~.calibration.serving_load`) apply on top: the step stretched by
the requests taken in and tokens streamed per second before it, a pause between busy steps, what
waking an idle engine costs after that long idle, and the calibrated slow moments (a seeded
factor of mean 1 that carries over from step to step). Without them, steps run back to back
(gap and lead 0). ``vidur.step_time_scale`` multiplies every step and every pause.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import serving_load
from gpu_simulate_test.calibration.serving_load import ServingLoad
from gpu_simulate_test.simulator.types import Composition
from gpu_simulate_test.vidur_simulate.loop_setup import BatchTimer


def predicted_s(timer: BatchTimer, chunks: Sequence[tuple[int, int]]) -> float:
    """Vidur's shape of a step (with the engine overhead, no jitter): one-token entries are
    decodes (their mean KV size rounded up to the granularity), the others prefill chunks with
    their KV size rounded up."""
    g = timer.granularity
    total_q = 0
    ones = ones_kv = 0
    prefills: list[tuple[int, int]] = []
    for q, kv in chunks:
        total_q += q
        if q == 1:
            ones += 1
            ones_kv += kv
        else:
            prefills.append(((kv + g - 1) // g * g, q))
    mean_kv = 0
    if ones:
        mean_kv = int(ones_kv / ones)
        mean_kv = (mean_kv + g - 1) // g * g
    return timer.time(total_q, ones, mean_kv, tuple(prefills))


class PredictorClock:
    """A :class:`~.vllm_v1.StepClock` from Vidur's predictor (with the fitted engine overhead
    and jitter, as :class:`~.loop_setup.BatchTimer` gives them) and the serving terms."""

    def __init__(
        self,
        timer: BatchTimer,
        serving: ServingLoad | None = None,
        seed: int = 0,
        scale: float = 1.0,
    ) -> None:
        self.timer = timer
        self.serving = serving
        self.scale = scale
        """``vidur.step_time_scale``: every step and every pause between steps, times this."""
        self._noise = serving.noise(seed) if serving is not None else None
        self._recent: deque[tuple[float, int, int]] = deque()
        """(end, requests taken in, tokens streamed) of the steps in the serving window."""
        self._taken = self._streamed = 0
        """Their sums."""
        self._end = 0.0

    def _rates(self, at: float) -> tuple[float, float]:
        """Requests taken in and tokens streamed per second over the window before ``at`` (no
        later than any recorded step's end: steps are scheduled after the previous one ends)."""
        assert self.serving is not None
        window = self.serving.window_s
        while self._recent and self._recent[0][0] <= at - window:
            _, new, tokens = self._recent.popleft()
            self._taken -= new
            self._streamed -= tokens
        return self._taken / window, self._streamed / window

    def gap(self, index: int) -> float:
        if self.serving is None:
            return 0.0
        return self.serving.gap_s(*self._rates(self._end)) * self.scale

    def lead(self, index: int) -> float:
        return 0.0

    def body(self, index: int, step: Composition) -> float:
        value = predicted_s(self.timer, step.chunks)
        if self.serving is not None:
            if step.idle_s > 0:
                stretched = value * self.serving.stretch()
                value = max(0.5 * value, stretched + self.serving.wake_s(step.idle_s))
            else:  # the slow moments were measured on busy steps
                assert self._noise is not None
                value = value * self.serving.stretch(*self._rates(step.start_s))
                value = value * next(self._noise)
        if self.timer.jitter is not None:
            value = value * self.timer.jitter()
        value = value * self.scale
        if self.serving is not None:
            self._end = step.start_s + value
            new = step.first_scheduled  # taken in (a prefix-cache hit's chunk is not q == kv)
            self._recent.append((self._end, new, step.decode_requests))
            self._taken += new
            self._streamed += step.decode_requests
        return value


def fit_serving(
    timer: BatchTimer, serving_steps: pd.DataFrame
) -> tuple[ServingLoad, pd.DataFrame, np.ndarray]:
    """The serving terms from the bundle's calibration replays (``serving_steps``, each
    replay's steps apart), against this predictor; with each replay step's features and predicted
    time (for the report and the plot)."""
    parts = [p.reset_index(drop=True) for _, p in serving_steps.groupby("replay", sort=False)]
    features = pd.concat([serving_load.step_features(p) for p in parts], ignore_index=True)
    predicted = serving_load.predictions(features, lambda chunks: predicted_s(timer, chunks))
    rates = pd.concat(parts, ignore_index=True)["rate_qps"].to_numpy(dtype=float)
    return serving_load.fit(features, predicted, rates), features, predicted
