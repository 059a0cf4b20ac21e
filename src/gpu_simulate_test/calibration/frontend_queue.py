"""The serving front end as a queue, on the client's clock (issue 28, item 3).

vLLM's API server is one process with one event loop: it takes each request in (parse, tokenize,
hand it to the engine core) and, after every engine step, turns the step's outputs into stream
chunks (detokenize, one server-sent event per request, written to its socket). On 2 CPU cores it
shares the cores with the engine core and the client. A constant delay per token cannot follow
that: measured on a real vLLM server (tiny Qwen3, 300 requests), the engine's tokens reached the
client 5.7 ms later at p50 at 20 req/s and 9.7 ms at 50 req/s, and a step's tokens later the more
tokens it streamed (2.9 ms for one, 11.3 ms for 16 to 40).

:class:`FrontEndQueue` is that server: one FIFO queue of jobs, each request's ``request_ms`` at
its send and each step's ``step_ms + token_ms · tokens`` at the step's end. A step's tokens reach
the client, on average, once its job has started and done ``step_ms`` plus half its tokens' work
(they go out one by one). It moves the client's clock only: when a request reaches the engine
stays the calibrated input model's (:class:`~.overhead.FrontEnd`), so the
engine-clock comparison is untouched. :func:`fit` finds the three costs on a recorded run: each
token's delay from its step's end (the engine's stamp) to the client. A request's first token
also pays its first stream chunk's extra work (``first_ms``: the first server-sent event of a
stream costs the API server more than a later one), read off the same run's first tokens
apart from the later ones once the three are fitted.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import input_spread
from gpu_simulate_test.calibration.overhead import calibrated_ms
from gpu_simulate_test.core.engines.step_record import parse_requests

KEYS: tuple[str, ...] = ("request_ms", "step_ms", "token_ms")
"""The queue's three costs, as the calibration stores them (milliseconds)."""
FIRST_KEY = "first_ms"
"""The first chunk's extra delay, stored beside them (calibration version 13 on; 0 before)."""
MIN_TOKENS = 50
"""Fewer observed tokens than this fit nothing."""
MIN_FIRST_TOKENS = 20
"""Fewer observed first tokens than this: no first-chunk term (``first_ms`` 0)."""
IDLE_SPREAD_KEY = "first_idle_residual_ms"
"""The first tokens' spread around the queue's delay, of the requests sent to an idle engine
(calibration version 16 on): their quantiles at :data:`~.input_spread.SPREAD_LEVELS`."""
BUSY_SPREAD_KEY = "first_busy_residual_ms"
"""The same of the requests sent to a busy engine, per bucket of requests in flight at the send
(:data:`~.input_spread.SPREAD_BUCKETS` from 1; calibration version 18 on)."""


@dataclass(frozen=True)
class FrontEndQueue:
    """The API server as one FIFO server (milliseconds of its work)."""

    request_ms: float
    """A request's work at its send."""
    step_ms: float
    """A step's outputs' work before its first token goes out."""
    token_ms: float
    """Each token a step streams."""
    first_ms: float = 0.0
    """A request's first token's delay beyond a later token's of the same step (its stream's
    first chunk)."""
    first_idle_residual_ms: tuple[float, ...] = ()
    """A request sent to an idle engine: its first token's measured delay less the queue's, at
    :data:`~.input_spread.SPREAD_LEVELS` (empty: not recorded, before version 16):
    ``vidur.frontend_idle_spread``'s draws for the way back."""
    first_busy_residual_ms: tuple[tuple[int, tuple[float, ...]], ...] = ()
    """The same of a request sent to a busy engine, per bucket of requests in flight at its send
    (its lower bound, increasing; empty: not recorded, before version 18):
    ``vidur.frontend_busy_spread``'s draws. The queue's costs give a step's mean delay; a first
    token's spreads around it, the more so the busier the engine (the API server shares its
    core with the engine core and the client)."""

    def delivery_delays_s(
        self, sends_s: np.ndarray, step_end_s: np.ndarray, step_tokens: np.ndarray
    ) -> np.ndarray:
        """Per step: from its end to when its tokens reach the client, on average (seconds)."""
        ends = np.asarray(step_end_s, dtype=float)
        tokens = np.asarray(step_tokens, dtype=float)
        starts, _ = self._serve(sends_s, ends, tokens)
        step_s, token_s = self.step_ms / 1e3, self.token_ms / 1e3
        delays: np.ndarray = starts - ends + step_s + token_s * (tokens + 1.0) / 2.0
        return np.where(tokens > 0, delays, 0.0)

    def input_waits_s(
        self, sends_s: np.ndarray, step_end_s: np.ndarray, step_tokens: np.ndarray
    ) -> np.ndarray:
        """Per send (in the order given; NaN for a NaN send): how long its request waits in the
        queue before the server takes it in, behind the other requests' input and the stream
        work of the steps that ended before it (as :meth:`delivery_delays_s` serves them)."""
        _, waits = self._serve(
            sends_s, np.asarray(step_end_s, dtype=float), np.asarray(step_tokens, dtype=float)
        )
        return waits

    def _serve(
        self, sends_s: np.ndarray, ends: np.ndarray, tokens: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """The one server, first in first out: per step, when its stream work starts (its end
        for a step without tokens); per send (in the order given), how long its input waited
        (NaN for a NaN send). A send at a step's end is taken first (it was read before the
        step's outputs)."""
        sent = np.asarray(sends_s, dtype=float)
        by_time = np.argsort(sent, kind="stable")  # NaN sorts last and is never served
        request_s, step_s, token_s = (
            self.request_ms / 1e3,
            self.step_ms / 1e3,
            self.token_ms / 1e3,
        )
        starts = np.empty(len(ends))
        waits = np.full(len(sent), np.nan)
        times = sent[by_time].tolist()  # floats in a list: the loop reads them one by one
        free, i, n = -np.inf, 0, int(np.count_nonzero(~np.isnan(sent)))
        for k in [*np.argsort(ends, kind="stable").tolist(), -1]:  # -1: the sends after
            end = float(ends[k]) if k >= 0 else np.inf
            while i < n and times[i] <= end:
                waits[by_time[i]] = max(0.0, free - times[i])
                free = max(free, times[i]) + request_s
                i += 1
            if k < 0:
                break
            if tokens[k] <= 0:
                starts[k] = end
                continue
            starts[k] = max(free, end)
            free = starts[k] + step_s + token_s * tokens[k]
        return starts, waits

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: round(float(getattr(self, k)), 4) for k in (*KEYS, FIRST_KEY)}
        if self.first_idle_residual_ms:
            out[IDLE_SPREAD_KEY] = list(self.first_idle_residual_ms)
        if self.first_busy_residual_ms:
            out[BUSY_SPREAD_KEY] = {str(k): list(v) for k, v in self.first_busy_residual_ms}
        return out

    @classmethod
    def from_calibration(cls, recorded: Any, where: str) -> FrontEndQueue:
        """From ``engine_calibration.<backend>.frontend.queue`` (without ``first_ms``, a
        calibration before version 13: 0; without ``first_idle_residual_ms``, before 16, or
        ``first_busy_residual_ms``, before 18: no such spread); ValueError naming ``where``."""
        values = calibrated_ms(recorded, KEYS, where, optional=(FIRST_KEY,))
        costs = (values["request_ms"], values["step_ms"], values["token_ms"])
        first = values.get(FIRST_KEY, 0.0)
        idle: tuple[float, ...] = ()
        if (spread := recorded.get(IDLE_SPREAD_KEY)) is not None:
            at, what = f"{where}.{IDLE_SPREAD_KEY}", "an idle engine's first tokens' spread"
            idle = input_spread.quantiles(spread, at, what)
        busy = input_spread.residuals(
            recorded.get(BUSY_SPREAD_KEY),
            where,
            BUSY_SPREAD_KEY,
            "a busy engine's first tokens' spread around the queue's",
        )
        return cls(*costs, first, idle, busy)


@dataclass(frozen=True)
class Emitted:
    """Which steps of a schedule made tokens: per step how many, per request its first and last
    token's step (row positions in the schedule; -1: none)."""

    step_tokens: np.ndarray
    first_step: dict[str, int]
    last_step: dict[str, int]


def emitted(schedule: pd.DataFrame, prompt_tokens: Mapping[str, int]) -> Emitted:
    """Tokens made by each step of an ``engine_schedule`` table: a request makes its first token
    in the step whose chunk completes its prompt (``prompt_tokens`` by request id) and one in each
    step after. Requests not in ``prompt_tokens`` (another run's) are not counted."""
    tokens = np.zeros(len(schedule), dtype=np.int64)
    done: dict[str, int] = {}
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for k, text in enumerate(schedule["requests"].to_numpy()):
        for rid, new in parse_requests(text):
            prompt = prompt_tokens.get(rid)
            if prompt is None:
                continue
            before = done.get(rid, 0)
            done[rid] = before + new
            if before + new >= prompt:
                tokens[k] += 1
                first.setdefault(rid, k)
                last[rid] = k
    return Emitted(tokens, first, last)


@dataclass(frozen=True)
class Observed:
    """One recorded run's part for the fit: sends, steps and each streamed token's delay."""

    sends_s: np.ndarray
    step_end_s: np.ndarray
    step_tokens: np.ndarray
    token_step: np.ndarray
    """Per observed token, its step (row position)."""
    delay_s: np.ndarray
    """Per observed token, from its step's end to the client."""
    first: np.ndarray
    """Per observed token, whether it is its request's first."""
    idle: np.ndarray | None = None
    """Per observed token, whether it is the first of a request sent to an idle engine (None:
    none is)."""
    running: np.ndarray | None = None
    """Per observed token, the requests in flight at its request's send (-1: not known; None:
    not recorded)."""


def observed(
    sends_s: Sequence[float],
    step_end_s: np.ndarray,
    step_tokens: np.ndarray,
    token_engine_s: Sequence[float],
    token_client_s: Sequence[float],
    token_first: Sequence[bool] | None = None,
    tolerance_s: float = 1e-4,
    token_idle: Sequence[bool] | None = None,
    token_running: Sequence[int] | None = None,
) -> Observed:
    """Pair each token's engine stamp with its step (the step ending at the stamp, within
    ``tolerance_s``); tokens with no such step are left out. ``token_first``: per token,
    whether it is its request's first (None: none is); ``token_idle``: whether it is the first
    of a request sent to an idle engine (None: none is); ``token_running``: the requests in
    flight at its request's send (None: not recorded)."""
    ends = np.asarray(step_end_s, dtype=float)
    engine = np.asarray(token_engine_s, dtype=float)
    client = np.asarray(token_client_s, dtype=float)
    order = np.argsort(ends, kind="stable")
    sorted_ends = ends[order]
    pos = np.clip(np.searchsorted(sorted_ends, engine), 0, max(len(ends) - 1, 0))
    prev = np.clip(pos - 1, 0, max(len(ends) - 1, 0))
    nearer = np.where(
        np.abs(sorted_ends[prev] - engine) < np.abs(sorted_ends[pos] - engine), prev, pos
    )
    ok = np.abs(sorted_ends[nearer] - engine) <= tolerance_s if len(ends) else np.zeros(0, bool)
    return Observed(
        np.asarray(sends_s, dtype=float),
        ends,
        np.asarray(step_tokens, dtype=float),
        order[nearer[ok]],
        client[ok] - engine[ok],
        (np.zeros(len(engine), bool) if token_first is None else np.asarray(token_first, bool))[ok],
        (np.zeros(len(engine), bool) if token_idle is None else np.asarray(token_idle, bool))[ok],
        None if token_running is None else np.asarray(token_running, dtype=np.int64)[ok],
    )


def _errors(queue: FrontEndQueue, runs: Sequence[Observed]) -> np.ndarray:
    parts = []
    for run in runs:
        delays = queue.delivery_delays_s(run.sends_s, run.step_end_s, run.step_tokens)
        parts.append(delays[run.token_step] - run.delay_s)
    return np.concatenate(parts) if parts else np.zeros(0)


def fit(runs: Sequence[Observed]) -> dict[str, Any] | None:
    """The three costs minimizing the mean absolute error of every token's delay (Nelder-Mead
    over non-negative costs), with that error beside the best constant delay's (the median: what
    a constant front end can do at best on the same tokens). None under :data:`MIN_TOKENS`."""
    from scipy.optimize import minimize  # type: ignore[import-untyped]

    delays = np.concatenate([r.delay_s for r in runs]) if runs else np.zeros(0)
    if len(delays) < MIN_TOKENS:
        return None

    def loss(x: np.ndarray) -> float:
        queue = FrontEndQueue(*np.abs(x).tolist())
        return float(np.mean(np.abs(_errors(queue, runs))))

    start = np.array([2.0, 2.0, 0.3])
    best = minimize(loss, start, method="Nelder-Mead", options={"xatol": 0.02, "fatol": 1e-6})
    queue = FrontEndQueue(*np.abs(best.x).tolist())
    errors = _errors(queue, runs)
    first = np.concatenate([r.first for r in runs])
    if np.count_nonzero(first) >= MIN_FIRST_TOKENS:  # the first chunk, over the three's
        beyond = max(0.0, -float(np.median(errors[first])))
        queue = FrontEndQueue(queue.request_ms, queue.step_ms, queue.token_ms, 1e3 * beyond)
        errors = errors + np.where(first, beyond, 0.0)
    constant = float(np.median(delays))
    idle = np.concatenate([_idle(r) for r in runs])
    spread: dict[str, Any] = {}
    if np.count_nonzero(idle) >= input_spread.MIN_SPREAD_SAMPLES:  # measured - the queue's
        levels = np.quantile(-errors[idle], input_spread.SPREAD_LEVELS)
        spread = {IDLE_SPREAD_KEY: [round(1e3 * float(v), 4) for v in levels]}
    running = np.concatenate([_running(r) for r in runs])
    first_busy = first & (running > 0)
    if busy := busy_spread_ms(-errors, first_busy, running):
        spread[BUSY_SPREAD_KEY] = busy
    return {
        **queue.to_dict(),
        **spread,
        "first_idle_tokens": int(np.count_nonzero(idle)),
        "first_busy_tokens": int(np.count_nonzero(first_busy)),
        "first_tokens": int(np.count_nonzero(first)),
        "tokens": len(delays),
        "steps": int(sum(len(r.step_end_s) for r in runs)),
        "mean_abs_error_ms": round(1e3 * float(np.mean(np.abs(errors))), 4),
        "constant_ms": round(1e3 * constant, 4),
        "constant_mean_abs_error_ms": round(1e3 * float(np.mean(np.abs(delays - constant))), 4),
        "measured_delay_ms": [round(1e3 * float(v), 4) for v in np.percentile(delays, [50, 90])],
        "predicted_delay_ms": [
            round(1e3 * float(v), 4) for v in np.percentile(errors + delays, [50, 90])
        ],
    }


def _idle(run: Observed) -> np.ndarray:
    return np.zeros(len(run.delay_s), bool) if run.idle is None else run.idle


def _running(run: Observed) -> np.ndarray:
    return np.full(len(run.delay_s), -1) if run.running is None else run.running


def busy_spread_ms(
    beyond_s: np.ndarray, first_busy: np.ndarray, running: np.ndarray
) -> dict[str, list[float]]:
    """Per bucket of requests in flight at the send (:func:`~.input_spread.spread_bucket`) with
    at least :data:`~.input_spread.MIN_SPREAD_SAMPLES` first tokens of requests sent to a busy
    engine (``first_busy``): the quantiles of their delay beyond the queue's (``beyond_s``,
    measured less modelled) at :data:`~.input_spread.SPREAD_LEVELS`, in milliseconds."""
    buckets = input_spread.spread_bucket(running)
    out = {}
    for bucket in np.unique(buckets[first_busy]):
        mine = first_busy & (buckets == bucket)
        if np.count_nonzero(mine) >= input_spread.MIN_SPREAD_SAMPLES:
            levels = np.quantile(beyond_s[mine], input_spread.SPREAD_LEVELS)
            out[str(int(bucket))] = [round(1e3 * float(v), 4) for v in levels]
    return out


def request_delays_s(
    queue: FrontEndQueue,
    schedule: pd.DataFrame,
    prompt_tokens: np.ndarray,
    sends_s: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Each request's first and last token's way back to the client (seconds) through
    ``queue``, in a simulated schedule whose request ids are positions in ``prompt_tokens`` and
    ``sends_s`` (when the client sent each, on the schedule's clock); ``prompt_tokens``: the
    prompt tokens each computes (less those its prefix-cache hit served). NaN where a request
    made no token."""
    prompts = {str(i): int(p) for i, p in enumerate(np.asarray(prompt_tokens))}
    made = emitted(schedule, prompts)
    delays = queue.delivery_delays_s(
        sends_s, schedule["end_time_s"].to_numpy(dtype=float), made.step_tokens
    )
    first = np.full(len(prompts), np.nan)
    last = np.full(len(prompts), np.nan)
    chunk_s = queue.first_ms / 1e3
    for rid, k in made.first_step.items():
        first[int(rid)] = delays[k] + chunk_s
    for rid, k in made.last_step.items():  # a request whose last token is its first pays it too
        last[int(rid)] = delays[k] + (chunk_s if made.first_step.get(rid) == k else 0.0)
    return first, last


def input_waits_s(
    queue: FrontEndQueue, schedule: pd.DataFrame, prompt_tokens: np.ndarray, sends_s: np.ndarray
) -> np.ndarray:
    """Each request's wait in ``queue`` before the server takes it in (seconds,
    :meth:`FrontEndQueue.input_waits_s`), in a simulated schedule read as
    :func:`request_delays_s` reads it."""
    prompts = {str(i): int(p) for i, p in enumerate(np.asarray(prompt_tokens))}
    made = emitted(schedule, prompts)
    return queue.input_waits_s(
        sends_s, schedule["end_time_s"].to_numpy(dtype=float), made.step_tokens
    )
