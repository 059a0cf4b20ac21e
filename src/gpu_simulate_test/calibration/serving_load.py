"""Step time under serving load: what besides a step's composition moves its time, and a model.

A calibration times the engine's steps alone on an idle engine (:mod:`.engine_steps`). Served,
the same composition takes longer, and more so the busier the engine: on 2 CPU cores the API
server streams tokens, tokenizes and answers HTTP on the cores the engine core computes on.
Measured on vLLM's own step record (fidelity loads at 20/50/85% of capacity): per composition,
the mean step over the median grows 1.03 → 1.06–1.08 (p90 1.14 → 1.37), the pause between steps
0.06 → 0.21 ms; and a step that wakes an idle engine takes longer the longer the engine slept
(a prompt's step 4.7 ms after 2–10 ms idle, 6.3 ms after more than 0.8 s, tiny Qwen3).

From the steps of calibration replays under load (the engine's recorded schedule of Poisson
workloads at a few rates, seeded apart from any judged workload, :mod:`.serving_replay`), each
step's time over its predicted time (``ratio``) is set against the candidates
(:data:`CANDIDATES`), and what matters is modelled (:class:`ServingLoad`):

- ``stretch(req)``: a busy step's time over its prediction, per calibrated rate of requests the
  engine took in per second over the window before it (the API server's work per request, on
  the cores the engine computes on), total time over total prediction so that long steps weigh
  what they last (a TPOT is a sum of steps, not a median), interpolated between the rates;
- ``gap(req)``: the engine's pause between busy steps, the same way; with ``intake_gap_ms``
  the pause before a busy step that takes in a request apart from the others';
- ``intake_ms``: what each request the client sends while a step runs adds to that step (the
  API server parses, tokenizes and hands it over on the cores the engine computes on: on the
  fidelity campaigns' truths, +0.9..2.1 ms a send at every load, +2.5..5 ms for two), from the
  replays' sends beside their steps (calibration version 12 on; none before);
- ``wake(idle)``: what a step that wakes an idle engine takes beyond ``stretch(0)`` of its
  prediction: per band of idle time (:mod:`.wake`) the median, interpolated in log10 of the
  idle time (a line in log10 where fewer than two bands are measured). On the main job's
  truths the wake-up is no line: a prompt's step took 6.4 ms after under 20 ms idle, 6.7 ms
  after 20–50, 8.0 after 50–100, 9.6 after 100–200, 10.6 after 200–400 and 11.2 after more
  (ten real runs, 2026-12-03), flat, then steep, then flat; a line fitted where most wake-ups
  are short put it at 1.7–3.5 ms at 300 ms idle where the truths took 4.2;
- ``noise(seed)``: the slow moments, a spread in log time on busy steps whose slow part carries
  over from step to step.

The predictor-timed simulation of vLLM's V1 scheduler applies them per step
(:class:`~gpu_simulate_test.simulator.step_model.PredictorClock`).
"""

from __future__ import annotations

import bisect
import functools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import busy_spread, intake_phase, serving_noise, wake
from gpu_simulate_test.calibration.intake_step import fit as intake_step_fit
from gpu_simulate_test.calibration.serving_inputs import (
    CLIENT_SENDS,
    FitInputs,
    fit_inputs,
    late,
    sends,
)
from gpu_simulate_test.core.engines.step_record import FOREIGN, parse_requests

WINDOW_S = 0.5
"""Requests and tokens per second are counted over this window before a step's start."""
MIN_BUSY_STEPS = 20
"""Busy steps needed to fit stretch and gap (fewer: a ratio of 1 and no pause)."""
MIN_INTAKE_STEPS = 5
"""Busy steps that take in a request (and, per rate, that take in none) needed to set their
pauses apart (fewer: one mean pause)."""
MIN_IDLE_STEPS = 5
"""Idle wake-ups needed to fit ``wake`` (fewer: none)."""
CANDIDATES: Mapping[str, str] = MappingProxyType(
    {
        "arrival_rate": "requests the engine took in per second in the 0.5 s before the step",
        "stream_rate": "tokens streamed per second in the 0.5 s before the step",
        "in_flight": "requests running or waiting after the step was scheduled",
        "waiting": "requests waiting in the engine's queue after scheduling",
        "arrivals": "requests the step saw for the first time",
        "finishing": "requests that ran for the last time in the step",
        "idle_ms": "how long the engine was idle before the step (0: busy)",
        CLIENT_SENDS: "requests the client sent while the step ran",
    }
)
"""What the residual analysis sets each step's ratio against."""
AXIS_LABELS: Mapping[str, str] = MappingProxyType(
    {
        "arrival_rate": "requests taken in, last 0.5 s (req/s)",
        "stream_rate": "tokens streamed, last 0.5 s (tokens/s)",
        "in_flight": "requests running or waiting (requests)",
        "waiting": "requests waiting (requests)",
        "arrivals": "requests new in the step (requests)",
        "finishing": "requests finishing in the step (requests)",
        "idle_ms": "engine idle before the step (ms, log)",
        CLIENT_SENDS: "requests sent during the step (requests)",
    }
)
"""Each candidate's axis label, in words with its unit (the plot's)."""


def step_features(schedule: pd.DataFrame) -> pd.DataFrame:
    """Per step of an ``engine_schedule`` table: its time, the pause before it, whether it woke
    an idle engine and after how long, and the candidates (:data:`CANDIDATES`); ``chunks`` holds
    (query tokens, KV tokens after the step) per scheduled request, for a prediction."""
    start = schedule["start_time_s"].to_numpy(dtype=float)
    end = schedule["end_time_s"].to_numpy(dtype=float)
    n = len(schedule)
    seen: dict[str, int] = {}
    last: dict[str, int] = {}
    chunks: list[tuple[tuple[int, int], ...]] = []
    arrivals = np.zeros(n, dtype=int)
    for k, items in enumerate(schedule["requests"]):
        step = []
        for rid, tokens in parse_requests(items):
            if rid != FOREIGN and rid not in seen:
                arrivals[k] += 1
            seen[rid] = seen.get(rid, 0) + tokens
            last[rid] = k
            step.append((tokens, seen[rid]))
        chunks.append(tuple(step))
    finishing = np.zeros(n, dtype=int)
    for rid, k in last.items():
        if rid != FOREIGN:
            finishing[k] += 1
    running = schedule["num_running"].to_numpy(dtype=int)
    waiting = schedule["num_waiting"].to_numpy(dtype=int)
    before = np.concatenate([[0], running[:-1] - finishing[:-1] + waiting[:-1]])
    busy = before > 0
    prev_end = np.concatenate([[np.nan], end[:-1]])
    pause = start - prev_end
    decodes = schedule["num_decode_requests"].to_numpy(dtype=float)
    streamed = np.concatenate([[0.0], np.cumsum(decodes)])
    taken = np.concatenate([[0.0], np.cumsum(arrivals)])
    lo = np.searchsorted(end, start - WINDOW_S, side="right")
    hi = np.searchsorted(end, start, side="right")
    return pd.DataFrame(
        {
            "body_s": end - start,
            "busy": busy,
            "gap_s": np.where(busy, pause, np.nan),
            "idle_ms": np.where(busy, 0.0, pause * 1e3),
            "arrival_rate": (taken[hi] - taken[lo]) / WINDOW_S,
            "stream_rate": (streamed[hi] - streamed[lo]) / WINDOW_S,
            "in_flight": running + waiting,
            "waiting": waiting,
            "arrivals": arrivals,
            "finishing": finishing,
            "decodes": decodes.astype(int),
            CLIENT_SENDS: sends(schedule),
            **(
                {
                    intake_phase.CLIENT_SEND_OFFSETS: schedule[
                        intake_phase.CLIENT_SEND_OFFSETS
                    ].to_numpy()
                }
                if intake_phase.CLIENT_SEND_OFFSETS in schedule.columns
                else {}
            ),
            "chunks": chunks,
        }
    )


@dataclass(frozen=True)
class ServingLoad:
    """The fitted serving terms: per calibrated rate (requests the engine took in per second),
    a busy step's time over its prediction and the pause before it, interpolated between the
    rates and flat beyond them; a wake-up line in log idle time; the slow moments' noise."""

    rate_points: tuple[float, ...] = ()
    """The calibration replays' mean requests taken in per second, increasing."""
    stretch_points: tuple[float, ...] = ()
    """At each: the busy steps' total time over their total prediction."""
    gap_points_ms: tuple[float, ...] = ()
    """At each: the mean pause between busy steps."""
    quiet_gap_points_ms: tuple[float, ...] = ()
    """At each: the mean pause before a busy step that takes in no request (empty: not
    apart, :attr:`gap_points_ms` for every step)."""
    intake_gap_ms: float = 0.0
    """The mean pause before a busy step that takes in a request, over every rate (0: not
    apart). vLLM's engine core takes a request in between two steps and stamps it queued
    there. Recorded by a step record that wrote the stamp there, the step that scheduled it
    started about a millisecond later in about half of them (the write let vLLM's output
    thread in first; calibration version 21 on, the stamp is written with the step's own line,
    :mod:`~gpu_simulate_test.core.engines.vllm_recording_scheduler`), where a step that takes in
    none starts a tenth of one after the last: the pause lands on the request's own first
    token, not spread over every step. Counted here on the steps that schedule a request for
    the first time; the simulated engine pauses so before the step after a request reached it
    (the same step unless the request waits for room in the batch: near saturation)."""
    wake0_ms: float = 0.0
    """A wake-up after 1 ms idle, beyond the prediction (may be negative)."""
    wake_per_decade_ms: float = 0.0
    """Added per tenfold longer idle."""
    max_idle_ms: float = 0.0
    """The longest idle calibrated."""
    wake_idle_ms: tuple[float, ...] = ()
    """Per band of idle time with wake-ups (:data:`~.wake.WAKE_BANDS_MS`), their median idle,
    increasing (empty: the line)."""
    wake_points_ms: tuple[float, ...] = ()
    """At each: the median wake-up beyond the prediction."""
    wake_residual_ms: tuple[float, ...] = ()
    """The calibration's wake-ups beyond :meth:`wake_s`, sorted (:mod:`.wake`): what a
    simulation with ``vidur.wake_spread`` draws one of per idle step."""
    noise_sigma: float = 0.0
    """Spread of a busy step's log time around the model (the slow moments a composition does
    not explain: the API server's bursts on the engine's cores)."""
    noise_phi: float = 0.0
    """Step-to-step carry-over of its slow part (slow moments last several steps)."""
    noise_slow_share: float = 0.0
    """The share of the spread's variance that is slow (the rest is new every step)."""
    busy_residual: tuple[tuple[float, ...], ...] = ()
    """Per band of decodes (:mod:`.busy_spread`), the busy steps' log time beyond the model:
    what a simulation with ``vidur.busy_spread`` draws a busy step's fast part from."""
    intake_ms: float = 0.0
    """What each request the client sends while a step runs adds to the step (0: not
    calibrated, a bundle before calibration version 12)."""
    intake_free_ms: float = 0.0
    """A send in a step's first this many ms adds nothing to it (the step's free part,
    :mod:`.intake_phase`; 0: every send adds ``intake_ms``, a bundle before version 17)."""
    intake_step_ms: float = 0.0
    """What a busy step that takes a request in adds (:mod:`.intake_step`; 0: not apart;
    signed: a calibration's noise may put a small one below zero)."""
    window_s: float = WINDOW_S

    def noise(self, seed: int, fast: bool = True) -> Iterator[float]:
        """Per step, a factor of mean 1: in log time, a slow AR(1) part (``noise_phi``, a
        ``noise_slow_share`` of the variance) plus a part new every step, seeded (1.0 forever
        without a spread); ``fast=False``: the slow part alone (the fast one drawn apart, from
        :attr:`busy_residual`), the same slow draws."""
        sigma, phi, share = self.noise_sigma, self.noise_phi, self.noise_slow_share
        rng = np.random.default_rng(seed)
        slow_sd, fast_sd = sigma * math.sqrt(share), sigma * math.sqrt(1.0 - share)
        innovation = slow_sd * math.sqrt(max(0.0, 1.0 - phi * phi))
        slow = float(rng.normal(0.0, slow_sd)) if slow_sd > 0 else 0.0
        spread = sigma * sigma if fast else slow_sd * slow_sd
        while True:
            drawn = float(rng.normal(0.0, fast_sd)) if fast_sd > 0 else 0.0
            yield math.exp(slow + (drawn if fast else 0.0) - spread / 2.0)
            if slow_sd > 0:
                slow = phi * slow + innovation * float(rng.normal())

    def stretch(self, arrival_rate: float = 0.0, stream_rate: float = 0.0) -> float:
        """A busy step's time over its prediction at ``arrival_rate`` requests per second
        (``stream_rate``, tokens per second, is recorded but not modelled: within the replays it
        moved step time less than the requests did)."""
        if not self.rate_points:
            return 1.0
        return interp(arrival_rate, self.rate_points, self.stretch_points)

    def gap_s(self, arrival_rate: float = 0.0, stream_rate: float = 0.0) -> float:
        """The pause before a busy step at ``arrival_rate``: where the pauses are apart
        (:attr:`intake_gap_ms`), before one that takes in no request."""
        if not self.rate_points:
            return 0.0
        points = self.quiet_gap_points_ms if self.pauses_apart else self.gap_points_ms
        return max(0.0, interp(arrival_rate, self.rate_points, points)) / 1e3

    @property
    def pauses_apart(self) -> bool:
        """Whether a busy step that takes in a request pauses apart (:attr:`intake_gap_ms`)."""
        return self.intake_gap_ms > 0 and len(self.quiet_gap_points_ms) == len(self.rate_points)

    def without_intake_pause(self) -> ServingLoad:
        """These terms with one mean pause before every busy step (:attr:`gap_points_ms`)."""
        return replace(self, quiet_gap_points_ms=(), intake_gap_ms=0.0)

    def wake_s(self, idle_s: float) -> float:
        """Seconds a step that wakes an engine idle for ``idle_s`` takes beyond its stretched
        prediction."""
        if self.wake_idle_ms:
            at = math.log10(max(1.0, idle_s * 1e3))
            return interp(at, self.wake_log_idle, self.wake_points_ms) / 1e3
        decades = math.log10(max(1.0, min(idle_s * 1e3, self.max_idle_ms)))
        return (self.wake0_ms + self.wake_per_decade_ms * decades) / 1e3

    @functools.cached_property
    def wake_log_idle(self) -> tuple[float, ...]:
        """:attr:`wake_idle_ms` in log10 (where the curve is interpolated; once per model, not
        per idle step)."""
        return tuple(math.log10(max(1.0, v)) for v in self.wake_idle_ms)


def interp(x: float, xp: Sequence[float], fp: Sequence[float]) -> float:
    """``np.interp`` at one point, bit for bit (its bracketing, its formula, its NaN rules),
    without NumPy's cost per call (a clock asks twice a simulated step)."""
    if len(xp) == 1:  # NumPy: the one value, whatever x is (NaN too)
        return float(fp[0])
    if x != x:  # NaN
        return x
    if x < xp[0]:
        return float(fp[0])
    if x > xp[-1]:
        return float(fp[-1])
    j = bisect.bisect_right(xp, x) - 1
    if j == len(xp) - 1 or xp[j] == x:
        return float(fp[j])
    slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j])
    y = slope * (x - xp[j]) + fp[j]
    if y != y:  # as NumPy: from the other end, then the flat value
        y = slope * (x - xp[j + 1]) + fp[j + 1]
        if y != y and fp[j] == fp[j + 1]:
            y = fp[j]
    return float(y)


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares intercept and slope (slope 0 without spread in x)."""
    if len(x) < 2 or np.ptp(x) == 0:
        return float(np.mean(y)) if len(y) else 0.0, 0.0
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


def fit(
    features: pd.DataFrame,
    predicted_s: np.ndarray,
    groups: np.ndarray | None = None,
    intake_step: bool = True,
) -> ServingLoad:
    """The serving terms from calibration-replay steps (``step_features``), each step's
    predicted time from its composition alone, and which rate each step was replayed at
    (``groups``; None: one rate).

    Per rate, over its busy steps: the mean requests taken in per second, the total time over
    the total prediction (so long steps weigh what they last: a TPOT is a sum of steps) and the
    mean pause; between the rates the terms are interpolated (measured: flat up to about a
    quarter of capacity, then rising; a line through the rates missed both ends). Steps that
    woke the engine: what they took beyond the lowest rate's stretch, a line in log10 of the
    idle time. Where the replays' sends were recorded beside their steps: what one send adds to
    a busy step (``intake_ms``), and the rates' stretch and the wake-ups without it. Where the
    features count the requests each step schedules for the first time (``arrivals``): the
    pause before the busy steps that take one in apart from the others' (``intake_gap_ms``,
    ``quiet_gap_points_ms``), and with ``intake_step`` what such a busy step takes beyond the
    others (``intake_step_ms``), the rates' stretch without it.
    """
    x = fit_inputs(features, predicted_s, groups)
    body, pred, req, busy, (_, taking) = x.body, x.pred, x.req, x.busy, x.pauses
    load = rated(x, body)
    intake_s = free_ms = 0.0
    if load.rate_points:  # within a rate, so that the rate's stretch (it carries them) cancels
        phase = intake_phase.fit(
            body - pred * stretches(load, req), x.length_ms, busy, x.offsets, x.labels, x.sends
        )
        intake_s, free_ms = (0.0, 0.0) if phase is None else (phase.intake_s, phase.free_ms)
    if intake_s > 0:  # the rates' stretch without what the sends added
        body = body - intake_s * x.late(free_ms)
        load = replace(rated(x, body), intake_ms=intake_s * 1e3, intake_free_ms=free_ms)
    if intake_step and load.rate_points and "arrivals" in features:  # stretch without it

        def stretched(steps_s: np.ndarray) -> np.ndarray:  # read at the busy steps only
            out = pred * np.nan
            out[busy] = pred[busy] * stretches(rated(x, steps_s), req[busy])
            return out

        if step_ms := intake_step_fit(body, stretched, busy, taking):
            body = body - step_ms / 1e3 * (busy & taking)
            again = rated(x, body)  # the pauses unchanged
            load = replace(load, stretch_points=again.stretch_points, intake_step_ms=step_ms)
    if load.rate_points:
        # each busy step's prediction stretched at its rate: what the noise and the busy
        # spread are read around
        modelled = pred.copy()
        modelled[busy] = pred[busy] * stretches(load, req[busy])
        sigma, phi, share = serving_noise.fit(body, modelled, busy, MIN_BUSY_STEPS)
        load = replace(load, noise_sigma=sigma, noise_phi=phi, noise_slow_share=share)
        if "decodes" in features:  # a step record's features (a planted frame may not)
            decodes = features["decodes"].to_numpy(dtype=float)[busy]
            log_residual = np.log(body[busy] / modelled[busy])
            load = replace(load, busy_residual=busy_spread.residuals(decodes, log_residual))
    idle_ms = features["idle_ms"].to_numpy(dtype=float)
    idle = ~features["busy"].to_numpy(dtype=bool) & x.predicted
    woke = idle & np.isfinite(idle_ms) & (idle_ms > 0)
    if woke.sum() >= MIN_IDLE_STEPS:
        extra_ms = (body[woke] - pred[woke] * load.stretch()) * 1e3
        w0, w1 = _line(np.log10(np.maximum(idle_ms[woke], 1.0)), extra_ms)
        bands, points = wake.curve(idle_ms[woke], extra_ms)
        load = replace(
            load,
            wake0_ms=w0,
            wake_per_decade_ms=w1,
            max_idle_ms=float(np.max(idle_ms[woke])),
            wake_idle_ms=bands,
            wake_points_ms=points,
        )
        residual = wake.residuals(idle_ms[woke], extra_ms, load.wake_s)
        load = replace(load, wake_residual_ms=residual)
    return load


def stretches(load: ServingLoad, req: np.ndarray) -> np.ndarray:
    """The busy stretch at each of these rates of requests taken in."""
    return np.array([load.stretch(r) for r in req])


def rated(x: FitInputs, body: np.ndarray) -> ServingLoad:
    """Per replayed rate with enough busy steps (``x.labels``): the mean requests taken in per
    second, the busy steps' total time (``body``: ``x.body``, or less what a term took out)
    over their total prediction, the mean pause and the mean pause before the busy steps that
    take in no request; and over every rate, the mean pause before the busy steps that take in
    one or more (``x.pauses``; none apart with fewer than :data:`MIN_INTAKE_STEPS` of
    either)."""
    pred, req, busy, labels, (gap, taking) = x.pred, x.req, x.busy, x.labels, x.pauses
    points = []
    intake = busy & taking & np.isfinite(gap)
    for label in np.unique(labels):
        mine = busy & (labels == label)
        if mine.sum() >= MIN_BUSY_STEPS:
            quiet = mine & ~taking & np.isfinite(gap)
            points.append(
                (
                    float(np.mean(req[mine])),
                    float(np.sum(body[mine]) / np.sum(pred[mine])),
                    float(np.nanmean(gap[mine])),
                    float(np.mean(gap[quiet])) if quiet.sum() >= MIN_INTAKE_STEPS else math.nan,
                )
            )
    points.sort()
    quiet_points = tuple(p[3] for p in points)
    apart = (
        bool(points)
        and intake.sum() >= MIN_INTAKE_STEPS
        and all(math.isfinite(v) for v in quiet_points)
    )
    return ServingLoad(
        rate_points=tuple(p[0] for p in points),
        stretch_points=tuple(p[1] for p in points),
        gap_points_ms=tuple(p[2] for p in points),
        quiet_gap_points_ms=quiet_points if apart else (),
        intake_gap_ms=float(np.mean(gap[intake])) if apart else 0.0,
    )


def modelled_s(load: ServingLoad, features: pd.DataFrame, predicted_s: np.ndarray) -> np.ndarray:
    """Each step's time as the serving model gives it: stretched, plus a wake-up when idle,
    plus the intake of the requests sent while it ran."""
    req = features["arrival_rate"].to_numpy(dtype=float)
    tok = features["stream_rate"].to_numpy(dtype=float)
    busy = features["busy"].to_numpy(dtype=bool)
    idle = features["idle_ms"].to_numpy(dtype=float) / 1e3
    offsets = intake_phase.step_offsets(features)
    intake = load.intake_ms / 1e3 * late(offsets, sends(features), load.intake_free_ms)
    out = np.empty(len(features))
    taking = (
        features["arrivals"].to_numpy() > 0 if "arrivals" in features else np.zeros(len(busy), bool)
    )
    for k, p in enumerate(np.asarray(predicted_s, dtype=float)):
        out[k] = p * (load.stretch(req[k], tok[k]) if busy[k] else load.stretch())
        out[k] += load.intake_step_ms / 1e3 if busy[k] and taking[k] else 0.0
        if not busy[k] and np.isfinite(idle[k]):
            out[k] = max(0.5 * p, out[k] + load.wake_s(idle[k]))
    return out + intake


def predictions(
    features: pd.DataFrame, predict_s: Callable[[Sequence[tuple[int, int]]], float]
) -> np.ndarray:
    """``predict_s(chunks)`` for every step (NaN where it has none)."""
    out = np.full(len(features), np.nan)
    for k, chunks in enumerate(features["chunks"]):
        try:
            out[k] = predict_s(chunks)
        except KeyError:
            continue
    return out
