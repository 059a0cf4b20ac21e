"""vLLM's V1 scheduler, step by step, in our event loop (``vidur.scheduler.name=vllm_v1``).

Vidur has no scheduler for vLLM's V1 engine. This one follows vLLM 0.32's
``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule`` and ``update_from_output``) for what
a served request meets there with prefix caching, speculative decoding, LoRA, encoders and KV
connectors off and synchronous scheduling (what vLLM runs on CPU):

- **one token budget** (``--max-num-batched-tokens``), spent first on the running requests in
  their order, each taking what it still lacks (a decode: one token; a prefill: the rest of its
  prompt, or of prompt and output after a preemption), capped by the budget and the long-prefill
  threshold (``long_prefill_token_threshold``, 0: off, and only with more than one request);
- **KV blocks** of ``--block-size`` tokens from ``--num-gpu-blocks-override`` blocks less vLLM's
  null block; a running request allocates what its new tokens need; when none are free the
  **last running request is preempted** (its blocks freed, its computed tokens reset: it will
  recompute prompt and output) and put at the head of the queue, until the request fits or is
  itself the one preempted, which ends the running pass;
- **waiting requests** only in a step that preempted nobody, in queue order, while the budget
  lasts and fewer than ``--max-num-seqs`` run; admitted only if the blocks for all their tokens so
  far are free (``scheduler_reserve_full_isl``); chunked prefill takes what the budget leaves;
- **after the step**, every request whose computed tokens reached its tokens emits one; one that
  has emitted its ``max_tokens`` finishes and frees its blocks.

Time: a step is scheduled at ``S`` and its outputs are made at ``E = S + body``; a request the
engine queued by ``S`` is in the queue. The next step is scheduled ``gap`` after ``E`` when there
is work, else ``lead`` after the next arrival. :class:`StepClock` gives those three per step:
from Vidur's predictor (:mod:`.predictor_clock`: the predicted step with the fitted engine overhead,
and the serving terms where calibrated) or from a real run's own steps (:mod:`.oracle`).

The result is Vidur's per-request rows (:func:`.request_rows.v1_rows`) plus the schedule, one
row per step with vLLM's own split of context and generation requests (as its log counts them: a
request resumed after preemption recomputes as generation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpu_simulate_test.core.engines.step_record import SCHEDULE_COLUMNS
from gpu_simulate_test.vidur_simulate.request_rows import v1_rows
from gpu_simulate_test.vidur_simulate.v1_engine import V1Engine
from gpu_simulate_test.vidur_simulate.v1_prefix import CachingV1Engine, Segments, block_keys
from gpu_simulate_test.vidur_simulate.v1_types import (
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
) -> V1Result:
    """Simulate requests (row ``i`` is request id ``i``) on vLLM's V1 scheduler.

    ``segments``: what each prompt is made of (:mod:`.v1_prefix`; with prefix caching, default:
    every prompt its own). ``after``: a closed loop (multi-turn sessions), per request the
    request sent when it finishes (-1: none) and the seconds from its last token to the send;
    such a request's ``arrived_at`` is NaN and becomes its send time."""
    arrivals = np.asarray(arrived_at, dtype=float)
    order = np.argsort(arrivals, kind="stable").tolist()
    prompt = [int(x) for x in np.asarray(prefill_tokens)]
    max_out = [int(x) for x in np.asarray(decode_tokens)]
    bs = params.block_size
    if min(prompt, default=1) < 1 or min(max_out, default=1) < 1:
        raise ValueError("every request needs at least one prompt and one output token")
    if len(prompt) and max(cdiv(p + o, bs) for p, o in zip(prompt, max_out, strict=True)) > (
        params.usable_blocks
    ):
        raise ValueError(
            f"a request needs more KV blocks than the cache has ({params.usable_blocks} usable "
            f"of {params.num_blocks}): vLLM would never finish it"
        )
    _check_closed_loop(arrivals, after)
    engine: V1Engine
    if params.enable_prefix_caching:
        if segments is None:
            segments = [[(("U", r), p)] for r, p in enumerate(prompt)]
        _check_segments(segments, prompt)
        keys = block_keys(segments, max_out, bs)
        engine = CachingV1Engine(params, arrivals.tolist(), prompt, max_out, keys)
    else:
        engine = V1Engine(params, arrivals.tolist(), prompt, max_out)
    if after is not None:
        engine.after = [(int(a), float(t)) for a, t in after]
    engine.run(clock, order)
    requests = v1_rows(
        engine.arr,
        prompt,
        max_out,
        engine.scheduled_at,
        engine.first_token,
        engine.done,
        engine.busy_s,
        engine.restarts,
    )
    requests[ENGINE_QUEUED] = np.asarray(engine.queued_at, dtype=float)
    if after is not None:
        requests[ARRIVED] = np.asarray(engine.arr, dtype=float)
    stats = None
    if isinstance(engine, CachingV1Engine):
        requests[CACHED_TOKENS] = np.asarray(engine.cached_tokens, dtype=np.int64)
        stats = dict(engine.stats)
    return V1Result(
        requests=requests,
        schedule=pd.DataFrame(engine.rows, columns=list(SCHEDULE_COLUMNS)),
        preemptions=engine.preemptions,
        prefix_cache=stats,
    )


def _check_closed_loop(arrivals: np.ndarray, after: Sequence[tuple[int, float]] | None) -> None:
    """Every request without an arrival follows exactly one other; think times >= 0."""
    n = len(arrivals)
    followed = np.zeros(n, dtype=np.int64)
    for r, (nxt, think) in enumerate(after or ()):
        if nxt < 0:
            continue
        if not (0 <= nxt < n) or nxt == r or not np.isnan(arrivals[nxt]) or think < 0:
            raise ValueError(
                f"request {r} is followed by request {nxt} after {think} s: expected another "
                "request without an arrival of its own and a think time >= 0"
            )
        followed[nxt] += 1
    lost = np.flatnonzero(np.isnan(arrivals) & (followed != 1))
    if len(lost):
        raise ValueError(
            f"request {int(lost[0])} has no arrival and does not follow exactly one request "
            f"({len(lost)} such)"
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
