"""One :class:`~.engine.VllmV1Engine` over a whole workload (:func:`run_v1`): requests in as
arrays, Vidur's per-request rows (:func:`.request_rows.v1_rows`) and the schedule out, one row per
step with vLLM's own split of context and generation requests (as its log counts them: a request
resumed after preemption recomputes as generation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpu_simulate_test.core.engines.step_record import SCHEDULE_COLUMNS
from gpu_simulate_test.simulator.engine import RequestBook, Row, Stretch, VllmV1Engine
from gpu_simulate_test.simulator.kv_cache import (
    CountingKVCache,
    KVCacheManager,
    PrefixKVCache,
    Segments,
    block_keys,
)
from gpu_simulate_test.simulator.request_rows import v1_rows
from gpu_simulate_test.simulator.types import (
    ARRIVED,
    CACHED_TOKENS,
    ENGINE_QUEUED,
    StepClock,
    V1Params,
    cdiv,
)


@dataclass
class V1Result:
    requests: pd.DataFrame
    """Vidur's ``request_metrics.csv`` rows, by request id."""
    schedule: pd.DataFrame
    """One row per step, the ``engine_schedule`` table (times on the simulation's clock)."""
    preemptions: int
    prefix_cache: dict[str, int] | None = None
    """With prefix caching: vLLM's ``PrefixCacheStats`` totals (queries and hits in tokens, first
    admissions apart from re-admissions after preemption)."""


def run_v1(
    params: V1Params,
    clock: StepClock,
    arrived_at: np.ndarray,
    prefill_tokens: np.ndarray,
    decode_tokens: np.ndarray,
    *,
    segments: Sequence[Segments] | None = None,
    after: Sequence[tuple[int, float]] | None = None,
    log_steps: bool = True,
) -> V1Result:
    """Simulate requests (row ``i`` is request id ``i``) on vLLM's V1 scheduler.

    ``segments``: what each prompt is made of (:mod:`.kv_cache`; with prefix caching, default:
    every prompt its own). ``after``: a closed loop (multi-turn sessions), per request the
    request sent when it finishes (-1: none) and the seconds from its last token to the send;
    such a request's ``arrived_at`` is NaN and becomes its send time."""
    work = Requests.of(params, arrived_at, prefill_tokens, decode_tokens, segments, after)
    engine = VllmV1Engine(
        params, work.book, work.cache(), clock, after=work.follows, log_steps=log_steps
    )
    for r in work.order:
        if not math.isnan(work.book.arr[r]):
            engine.add(r, work.book.arr[r])
    engine.advance()
    return V1Result(
        requests=work.rows(),
        schedule=schedule_frame(engine.rows),
        preemptions=engine.preemptions,
        prefix_cache=dict(engine.stats) if params.enable_prefix_caching else None,
    )


@dataclass
class Requests:
    """A workload checked and made ready for engines: the shared request book, the order of
    the known arrivals, the closed loop's followers and, with prefix caching, the blocks' keys."""

    params: V1Params
    book: RequestBook
    order: list[int]
    follows: list[tuple[int, float]] | None
    keys: list[list[int]] | None

    @classmethod
    def of(
        cls,
        params: V1Params,
        arrived_at: np.ndarray,
        prefill_tokens: np.ndarray,
        decode_tokens: np.ndarray,
        segments: Sequence[Segments] | None = None,
        after: Sequence[tuple[int, float]] | None = None,
    ) -> Requests:
        """Checked: every request fits the cache, the closed loop and segments are whole."""
        arrivals = np.asarray(arrived_at, dtype=float)
        prompt = [int(x) for x in np.asarray(prefill_tokens)]
        max_out = [int(x) for x in np.asarray(decode_tokens)]
        bs = params.block_size
        if min(prompt, default=1) < 1 or min(max_out, default=1) < 1:
            raise ValueError("every request needs at least one prompt and one output token")
        for r, (p, o) in enumerate(zip(prompt, max_out, strict=True)):
            if cdiv(p + o, bs) > params.usable_blocks:
                raise ValueError(
                    f"request {r} needs more KV blocks than the cache has ({cdiv(p + o, bs)} "
                    f"for its {p} prompt and {o} output tokens; {params.usable_blocks} usable of "
                    f"num_blocks={params.num_blocks}): vLLM would never finish it"
                )
        if not params.enable_chunked_prefill:
            _check_unchunked(params, prompt, max_out)
        _check_closed_loop(arrivals, after)
        keys = None
        if params.enable_prefix_caching:
            if segments is None:
                segments = [[(("U", r), p)] for r, p in enumerate(prompt)]
            _check_segments(segments, prompt)
            keys = block_keys(segments, max_out, bs)
        return cls(
            params,
            RequestBook(arrivals.tolist(), prompt, max_out),
            np.argsort(arrivals, kind="stable").tolist(),
            None if after is None else [(int(a), float(t)) for a, t in after],
            keys,
        )

    def cache(self) -> KVCacheManager:
        """An engine's own KV cache (each engine of a fleet has one)."""
        params = self.params
        if self.keys is not None:
            return PrefixKVCache(params.num_blocks, params.block_size, self.keys)
        return CountingKVCache(params.usable_blocks, params.block_size, len(self.book.prompt))

    def rows(self) -> pd.DataFrame:
        """Vidur's per-request rows from the book, with when each request was queued, its send
        time in a closed loop and its cached tokens with prefix caching."""
        book = self.book
        requests = v1_rows(
            book.arr, book.prompt, book.max_out, book.scheduled_at, book.first_token, book.done,
            book.busy_s, book.restarts,
        )  # fmt: skip
        requests[ENGINE_QUEUED] = np.asarray(book.queued_at, dtype=float)
        if self.follows is not None:
            requests[ARRIVED] = np.asarray(book.arr, dtype=float)
        if self.keys is not None:
            requests[CACHED_TOKENS] = np.asarray(book.cached_tokens, dtype=np.int64)
        return requests


def unsent_followers(
    arrival_s: np.ndarray, after: Sequence[tuple[int, float]] | None
) -> np.ndarray:
    """The arrivals with a closed loop's followers unsent (NaN: their sends are simulated, as
    :func:`run_v1` asks); a copy, as floats."""
    arrived = np.array(arrival_s, dtype=float)
    if after is not None:
        arrived[[nxt for nxt, _ in after if nxt >= 0]] = np.nan
    return arrived


def schedule_frame(rows: Sequence[Row]) -> pd.DataFrame:
    """The engines' step rows (a stretch's expanded) as the ``engine_schedule`` table, column by
    column (a frame from a list of rows infers the same dtypes, several times slower)."""
    columns: list[list[object]] = [[] for _ in SCHEDULE_COLUMNS]
    single: list[tuple[object, ...]] = []
    for row in rows:
        if isinstance(row, tuple):
            single.append(row)
            continue
        if single:
            for column, values in zip(columns, zip(*single, strict=True), strict=True):
                column.extend(values)
            single = []
        _extend_stretch(columns, row)
    if single:
        for column, values in zip(columns, zip(*single, strict=True), strict=True):
            column.extend(values)
    if not columns[0]:
        return pd.DataFrame([], columns=list(SCHEDULE_COLUMNS))
    *numbers, requests = columns
    frame = {
        name: np.array(values, dtype=float if name in _FLOAT_COLUMNS else np.int64)
        for name, values in zip(SCHEDULE_COLUMNS, numbers, strict=False)
    }
    frame[SCHEDULE_COLUMNS[-1]] = np.array(requests, dtype=object)
    return pd.DataFrame(frame, copy=False)


_FLOAT_COLUMNS = frozenset(SCHEDULE_COLUMNS[1:3])
"""The step's start and end; the other columns but the last (its requests) are counts."""


def _extend_stretch(columns: list[list[object]], stretch: Stretch) -> None:
    """A stretch's rows: one decode token per request a step, nothing waiting or preempted."""
    m = len(stretch.starts)
    n = len(stretch.requests)
    text = " ".join([f"{r}:1" for r in stretch.requests])
    index, start, end, npre, tpre, ndec, tdec, preempted, waiting, running, requests = columns
    index.extend(range(stretch.first_index, stretch.first_index + m))
    start.extend(stretch.starts)
    end.extend(stretch.ends)
    for column, value in ((npre, 0), (tpre, 0), (ndec, n), (tdec, n), (preempted, 0), (waiting, 0)):
        column.extend([value] * m)
    running.extend([n] * m)  # at each step's scheduling, as vLLM's step record counts them
    requests.extend([text] * m)


def _check_unchunked(params: V1Params, prompt: list[int], max_out: list[int]) -> None:
    """Without chunked prefill every request's prompt and output must fit one step's budget:
    vLLM refuses to start with a budget below ``max_model_len`` (its ``SchedulerConfig``), and
    a request longer than the budget would wait for ever (a prompt, or a preempted request's
    prompt and outputs so far, is only scheduled whole)."""
    budget = params.max_num_batched_tokens
    for r, (p, o) in enumerate(zip(prompt, max_out, strict=True)):
        if p + o > budget:
            raise ValueError(
                f"request {r} needs {p + o} tokens (prompt {p}, output {o}) in one step, more "
                f"than max_num_batched_tokens ({budget}) with enable_chunked_prefill=False: vLLM "
                "refuses a budget below max_model_len; raise the budget or turn chunked "
                "prefill on"
            )


def _check_closed_loop(arrivals: np.ndarray, after: Sequence[tuple[int, float]] | None) -> None:
    """Every request without an arrival follows exactly one other and is sent in the end (a
    chain from a request with an arrival, not a cycle); think times finite and >= 0."""
    n = len(arrivals)
    followed = np.zeros(n, dtype=np.int64)
    for r, (nxt, think) in enumerate(after or ()):
        if nxt < 0:
            continue
        if (
            not (0 <= nxt < n)
            or nxt == r
            or not np.isnan(arrivals[nxt])
            or not (math.isfinite(think) and think >= 0)
        ):
            raise ValueError(
                f"after[{r}] is ({nxt}, {think}): request {r} is followed by request {nxt} "
                f"after {think} s; expected another request without an arrival of its own and "
                "a finite think time >= 0"
            )
        followed[nxt] += 1
    lost = np.flatnonzero(np.isnan(arrivals) & (followed != 1))
    if len(lost):
        raise ValueError(
            f"request {int(lost[0])} has no arrival and does not follow exactly one request "
            f"in after ({len(lost)} such)"
        )
    if after is not None:
        sent = ~np.isnan(arrivals)
        for r in np.flatnonzero(sent).tolist():
            nxt = int(after[r][0])
            while nxt >= 0 and not sent[nxt]:  # each follows one: the chain ends
                sent[nxt] = True
                nxt = int(after[nxt][0])
        never = np.flatnonzero(~sent).tolist()
        if never:
            raise ValueError(
                f"after: requests {never[:10]} follow each other in a cycle, none with an "
                "arrival of its own, so none would ever be sent; expected every chain of "
                "turns to start at a request with an arrival"
            )


def _check_segments(segments: Sequence[Segments], prompt: list[int]) -> None:
    if len(segments) != len(prompt):
        raise ValueError(f"{len(segments)} prompts' segments for {len(prompt)} requests")
    for r, (parts, tokens) in enumerate(zip(segments, prompt, strict=True)):
        if sum(length for _, length in parts) != tokens:
            raise ValueError(
                f"request {r}: its segments hold {sum(n for _, n in parts)} "
                f"tokens, its prompt {tokens}"
            )
