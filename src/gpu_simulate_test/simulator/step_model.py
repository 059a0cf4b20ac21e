"""One step model (:class:`StepModel`): the time of a step of a given composition, built once
from the profiled ops (Vidur's predictor, wrapped and never changed), the engine's fitted per-step
overhead and the serving terms, at a host level (:meth:`StepModel.at_level`). Every engine's
clock (:meth:`StepModel.clock`) and every server-level check times steps through it.

A step's body is Vidur's prediction of its shape with the fitted engine overhead
(:class:`BatchTimer`). Where the bundle has calibration replays under load, the serving terms
(:mod:`~..calibration.serving_load`) apply on top: the step stretched by the requests taken in
and tokens streamed per second before it, a pause between busy steps, what waking an idle engine
costs after that long idle, what each request the client sends while a step runs adds to it
(given the sends), and the calibrated slow moments (a seeded factor of mean 1 that
carries over from step to step). Without them, steps run back to back (gap and lead 0). The
level (``vidur.step_time_scale``) multiplies every step and every pause.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import busy_spread, serving_inputs, serving_load, wake
from gpu_simulate_test.calibration.overhead import StepJitter, StepOverhead, step_s
from gpu_simulate_test.calibration.serving_load import ServingLoad
from gpu_simulate_test.simulator import intake_catch
from gpu_simulate_test.simulator.types import Composition

BasePredict = Callable[[Any, int], Any]
"""Vidur's own ``get_execution_time(batch, stage)`` (the profiled ops alone)."""


class BatchTimer:
    """A batch's execution time from Vidur's predictor, memoized on what the predictor reads:
    the profiled ops (``base``), the engine's per-step ``overhead`` (None: none), a ``jitter``
    draw per batch (only with an overhead) and a ``scale`` (``vidur.step_time_scale`` of Vidur's
    schedulers: in the jitter factor where there is one, as Vidur's predictor multiplies it)."""

    def __init__(
        self,
        base: BasePredict,
        granularity: int,
        overhead: StepOverhead | None = None,
        jitter: Callable[[], float] | None = None,
        scale: float = 1.0,
    ) -> None:
        self._base = base
        self.granularity = granularity
        self.overhead = overhead
        self.jitter: Callable[[], float] | None = jitter if overhead is not None else None
        self._scale = scale if self.jitter is None else 1.0
        if self.jitter is not None and scale != 1.0:
            draw = self.jitter
            self.jitter = lambda: draw() * scale
        self._memo: dict[tuple[Any, ...], float] = {}
        self.decodes: dict[tuple[int, int], float] = {}
        """:meth:`time` of a batch of decodes alone, by (decodes, their mean KV size rounded)."""

    def time(
        self, total_q: int, num_decodes: int, decode_kv: int, prefills: tuple[tuple[int, int], ...]
    ) -> float:
        """Seconds for a batch of ``total_q`` query tokens: ``num_decodes`` one-token entries
        whose mean KV size, rounded up to the granularity, is ``decode_kv``, and ``prefills``
        as (KV size rounded up, query tokens) in batch order. Before the jitter factor (which
        carries the scale where there is one)."""
        key = (total_q, num_decodes, decode_kv, prefills)
        value = self._memo.get(key)
        if value is None:
            q = [1] * num_decodes + [chunk for _, chunk in prefills]
            kv = [decode_kv] * num_decodes + [size for size, _ in prefills]
            shape = SimpleNamespace(
                num_q_tokens=q,
                num_kv_tokens=kv,
                _total_num_q_tokens=total_q,
                _total_num_q_tokens_rounded=(total_q + 7) // 8 * 8,
                # what the predictor would derive from the lists above (it reads these first)
                _decode_params=(num_decodes, decode_kv),  # (0, 0) without decodes
                _prefill_params=list(prefills),
            )
            value = float(self._base(shape, 0).total_time)
            if self.overhead is not None:  # ExecutionTimeWithOverhead.total_time, less the factor
                value = step_s(value, self.overhead.scale_for(q), self.overhead.ms(q))
            self._memo[key] = value
        return value * self._scale


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
    mean_kv = decodes_kv(ones_kv, ones, g) if ones else 0
    return timer.time(total_q, ones, mean_kv, tuple(prefills))


def decodes_kv(kv_tokens: int, decodes: int, granularity: int) -> int:
    """The decodes' mean KV size as Vidur's predictor reads it: truncated, then rounded up to
    the granularity."""
    return (int(kv_tokens / decodes) + granularity - 1) // granularity * granularity


class PredictorClock:
    """A :class:`~.types.StepClock` from a step model: Vidur's predictor with the fitted engine
    overhead (:class:`BatchTimer`), the jitter and the serving terms; one per engine and per
    run (its serving window and its draws are its own and go on from step to step, so an engine
    takes it for its run, :meth:`claim`)."""

    def __init__(
        self,
        timer: BatchTimer,
        serving: ServingLoad | None = None,
        seed: int = 0,
        scale: float = 1.0,
        jitter: Callable[[], float] | None = None,
        sends: Sequence[float] | np.ndarray | None = None,
        send_share: float = 1.0,
        arrivals: Sequence[float] | np.ndarray | None = None,
    ) -> None:
        self.timer = timer
        self.jitter = jitter
        """Each step's seeded jitter factor (None: every step at its calibrated median)."""
        self.serving = serving
        self.scale = scale
        """``vidur.step_time_scale``: every step and every pause between steps, times this."""
        self._busy = (
            busy_spread.Draws(serving.busy_residual, serving.noise_slow_share, seed)
            if serving is not None and serving.busy_residual
            else None
        )
        """Each busy step's fast spread from its band's calibrated steps (None: the noise's)."""
        self._noise = serving.noise(seed, self._busy is None) if serving is not None else None
        self._wake = (
            wake.Draws(serving.wake_residual_ms, seed)
            if serving is not None and serving.wake_residual_ms
            else None
        )
        """Each wake-up's seeded spread around the curve (None: on the curve)."""
        self._recent: deque[tuple[float, int, int]] = deque()
        """(end, requests taken in, tokens streamed) of the steps in the serving window."""
        self._taken = self._streamed = 0
        """Their sums."""
        self._end = 0.0
        self._sends: list[float] = (
            sorted(float(t) for t in np.asarray(sends, dtype=float) if t == t)
            if sends is not None and serving is not None and serving.intake_ms > 0
            else []
        )
        """The client's sends (its open loop's; a closed loop's later turns are not known
        ahead), for the serving terms' intake."""
        self._intake_s = 0.0 if serving is None else serving.intake_ms / 1e3 * send_share
        """What one send adds to the step it falls in (``send_share``: this engine's share of
        them, a fleet's replicas each taking in about theirs)."""
        self._free_s = 0.0 if serving is None else serving.intake_free_ms / 1e3
        """A send in a step's first this long adds nothing (the step's free part)."""
        self._catch = intake_catch.Intakes.of(sends, arrivals)
        """The requests' intakes a step's end waits for (None: ends as timed)."""
        self._claimed = False
        """Whether an engine has taken it for a run (:meth:`claim`)."""

    def claim(self) -> None:
        """Taken by an engine for its run: a second engine or run would go on from the serving
        window and the draws the first left, not repeat it, so it is refused."""
        if self._claimed:
            raise ValueError(
                "this clock has timed a run already: a clock times one engine's run (its "
                "serving window and seeded draws go on from where the run left them); make "
                "another for each run or engine with step_model.clock(seed, ...)"
            )
        self._claimed = True

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

    def intake_gap(self, index: int) -> float:
        """The pause before a busy step that takes in a request, where the serving terms set
        it apart (:attr:`~..calibration.serving_load.ServingLoad.intake_gap_ms`; else
        :meth:`gap`'s)."""
        serving = self.serving
        if serving is None or not serving.pauses_apart:
            return self.gap(index)
        return serving.intake_gap_ms / 1e3 * self.scale

    def lead(self, index: int) -> float:
        return 0.0

    def body(self, index: int, step: Composition) -> float:
        value = predicted_s(self.timer, step.chunks)
        return self._timed(
            value, step.start_s, step.idle_s, step.first_scheduled, step.decode_requests
        )

    def decode_body(self, index: int, start_s: float, requests: int, kv_tokens: int) -> float:
        """:meth:`body` of a busy step of ``requests`` decodes (none scheduled for the first
        time) whose KV sizes after the step sum to ``kv_tokens``: the same value, without the
        step's chunks (:meth:`VllmV1Engine.advance <.engine.VllmV1Engine.advance>`'s decode
        stretches)."""
        timer = self.timer
        mean_kv = decodes_kv(kv_tokens, requests, timer.granularity)
        value = timer.decodes.get((requests, mean_kv))
        if value is None:
            value = timer.decodes[requests, mean_kv] = timer.time(requests, requests, mean_kv, ())
        if self.serving is None and self.jitter is None and self._catch is None:
            return value * self.scale
        return self._timed(value, start_s, 0.0, 0, requests)

    def _timed(
        self, value: float, start_s: float, idle_s: float, first: int, decodes: int
    ) -> float:
        """A step's predicted seconds with the serving terms, the jitter and the scale."""
        serving = self.serving
        if serving is not None:
            if idle_s > 0:
                woken = value * serving.stretch() + serving.wake_s(idle_s)
                value = max(0.5 * value, woken + (self._wake() if self._wake else 0.0))
            else:  # the slow moments were measured on busy steps
                assert self._noise is not None
                value = value * serving.stretch(*self._rates(start_s))
                value = value * next(self._noise)
                if self._busy is not None:
                    value = value * self._busy(decodes)
                if first:  # it takes a request in (:mod:`~..calibration.intake_step`)
                    value = value + serving.intake_step_ms / 1e3
        if self._sends:  # the API server takes in the requests sent while the step runs
            end = start_s + value * self.scale
            past = start_s + self._free_s  # the sends past the step's free part
            sent = bisect.bisect_left(self._sends, end) - bisect.bisect_left(self._sends, past)
            value = value + self._intake_s * max(0, sent)
        if self.jitter is not None:
            value = value * self.jitter()
        value = value * self.scale
        if self._catch is not None:  # a step's end waits for the intakes under way
            value = self._catch.end_s(start_s + value) - start_s
        if serving is not None:
            self._end = start_s + value
            # taken in: first-scheduled requests (a prefix-cache hit's chunk is not q == kv)
            self._recent.append((self._end, first, decodes))
            self._taken += first
            self._streamed += decodes
        return value


def fit_serving(
    timer: BatchTimer, serving_steps: pd.DataFrame, intake_step: bool = True
) -> tuple[ServingLoad, pd.DataFrame, np.ndarray]:
    """The serving terms from the bundle's calibration replays (``serving_steps``, each
    replay's steps apart), against this predictor (``intake_step``: a busy step taking a request
    in apart, ``vidur.intake_step``); with each replay step's features and predicted time (for
    the report and the plot)."""
    parts = [p.reset_index(drop=True) for _, p in serving_steps.groupby("replay", sort=False)]
    features = pd.concat([serving_load.step_features(p) for p in parts], ignore_index=True)
    predicted = serving_load.predictions(features, lambda chunks: predicted_s(timer, chunks))
    rates = serving_inputs.replay_rates(serving_steps)
    return serving_load.fit(features, predicted, rates, intake_step), features, predicted


@dataclass(frozen=True, eq=False)
class StepModel:
    """The time of a step from its composition, built once (from a bundle's predictor, its
    calibration record and the engine's knobs) and handed to every simulation that times steps
    with it: the engines' clocks, a capacity search's rates, a tune's server-level checks."""

    timer: BatchTimer
    """The profiled ops and the engine's fitted per-step overhead (no jitter, no level)."""
    serving: ServingLoad | None = None
    """The serving terms from the bundle's calibration replays (None: steps back to back)."""
    jitter: StepJitter | None = None
    """The calibrated spread of step times, drawn per step with each clock's seed (None: every
    step at its median)."""
    level: float = 1.0
    """The host's level: every step and every pause times this (``vidur.step_time_scale``)."""
    overhead_report: dict[str, Any] | None = None
    """The overhead's fit and its calibration errors, for ``run_meta.json``."""
    overhead_fit: pd.DataFrame | None = None
    """Per calibration step: measured, Vidur's ops, fitted overhead, error."""
    serving_fit: tuple[ServingLoad, pd.DataFrame, np.ndarray] | None = None
    """The serving terms' fit: the replays' step features and each step's prediction."""
    cache_hit: bool = False
    """Whether Vidur's prediction tables came from its cache (none trained)."""
    intake_catch: bool = False
    """``vidur.intake_catch``: a step whose end falls while the API server is taking a
    request in ends when that request reaches the engine (:mod:`.intake_catch`);
    needs the clock's ``arrivals``."""

    def step_s(self, chunks: Sequence[tuple[int, int]]) -> float:
        """Seconds of a step of these (query tokens, KV tokens after the step) chunks, as the
        model predicts it (no serving terms, jitter or level)."""
        return predicted_s(self.timer, chunks)

    def at_level(self, level: float) -> StepModel:
        """The same model on a host ``level`` times as slow (shares the memoized predictions)."""
        if not (math.isfinite(level) and level > 0):
            raise ValueError(f"at_level({level!r}): the level must be a positive factor (1: as is)")
        return replace(self, level=level)

    def clock(
        self,
        seed: int,
        sends: Sequence[float] | np.ndarray | None = None,
        send_share: float = 1.0,
        arrivals: Sequence[float] | np.ndarray | None = None,
    ) -> PredictorClock:
        """A fresh clock for one engine: its own serving window and seeded draws; with the
        client's ``sends`` (seconds, NaN: not known ahead), each step also takes in the
        requests sent while it runs (``send_share`` of them: one replica's share); with
        :attr:`intake_catch` and the requests' ``arrivals`` at this engine (in the order of
        ``sends``), a step's end waits for the intakes under way."""
        draw = None
        if self.jitter is not None and self.timer.overhead is not None:
            draw = self.jitter.sampler(seed)
        caught = arrivals if self.intake_catch else None
        return PredictorClock(
            self.timer, self.serving, seed, self.level, draw, sends, send_share, caught
        )

    def describe(self) -> dict[str, Any]:
        """What the model is made of, for reports."""
        return {
            "ops": "Vidur's predictor over the profiled ops",
            "engine_overhead": self.overhead_report,
            "serving_terms": None if self.serving is None else "calibrated replays under load",
            "step_jitter": None if self.jitter is None else "calibrated spread",
            "level": self.level,
        }
