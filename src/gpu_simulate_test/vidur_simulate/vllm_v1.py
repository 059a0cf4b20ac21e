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

import math
from collections import deque
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd

from gpu_simulate_test.core.engines.step_record import SCHEDULE_COLUMNS
from gpu_simulate_test.vidur_simulate.request_rows import v1_rows

NAME = "vllm_v1"
ENGINE_QUEUED = "engine_queued_time"
"""Beside Vidur's columns: when the engine core took the request into its queue. vLLM's core
reads new requests only between steps, so one that arrives while a step runs is queued when it
ends (its engine clock starts there, as the real engine stamps it)."""


@dataclass(frozen=True)
class V1Params:
    """The knobs vLLM's scheduler reads (the ``vllm`` backend's, one for one)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_blocks: int
    """``--num-gpu-blocks-override``: vLLM keeps one of them as its null block."""
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1


@dataclass(frozen=True)
class Composition:
    """One step as vLLM's log counts it, and the batch shape Vidur's predictor reads."""

    prefill_requests: int
    prefill_tokens: int
    decode_requests: int
    decode_tokens: int
    chunks: tuple[tuple[int, int], ...]
    """(query tokens, KV tokens after the step) per scheduled request, in batch order."""
    start_s: float = 0.0
    """When it was scheduled (the simulation's clock)."""
    idle_s: float = 0.0
    """How long the engine had been idle before it (0: busy)."""

    @property
    def key(self) -> tuple[int, int, int, int]:
        return (
            self.prefill_requests,
            self.prefill_tokens,
            self.decode_requests,
            self.decode_tokens,
        )


class StepClock(Protocol):
    """When steps happen: per step ``index`` (from 0) and its composition."""

    def gap(self, index: int) -> float:
        """Seconds from the previous step's outputs to this step's scheduling, with work."""

    def lead(self, index: int) -> float:
        """Seconds from the arrival that woke an idle engine to this step's scheduling."""

    def body(self, index: int, step: Composition) -> float:
        """Seconds from scheduling to outputs."""


@dataclass
class V1Result:
    requests: pd.DataFrame
    """Vidur's ``request_metrics.csv`` rows, by request id."""
    schedule: pd.DataFrame
    """One row per step, the ``engine_schedule`` table (times on the simulation's clock)."""
    preemptions: int


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def run_v1(
    params: V1Params,
    clock: StepClock,
    arrived_at: np.ndarray,
    prefill_tokens: np.ndarray,
    decode_tokens: np.ndarray,
) -> V1Result:
    """Simulate requests (row ``i`` is request id ``i``) on vLLM's V1 scheduler."""
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
    engine = _Engine(params, arrivals.tolist(), prompt, max_out)
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
    return V1Result(
        requests=requests,
        schedule=pd.DataFrame(engine.rows, columns=list(SCHEDULE_COLUMNS)),
        preemptions=engine.preemptions,
    )


Chosen = list[tuple[int, int, bool]]
"""A step's requests in batch order: (request, new tokens, whether vLLM counts it as context)."""


class _Engine:
    """The scheduler's state between steps: per request (by id) its tokens, blocks and times,
    the waiting queue and the running list (vLLM's), the free blocks and the steps so far.
    :meth:`run` owns the clock, a step's outputs (vLLM's ``Scheduler.update_from_output``) and
    the order of its scheduling (``Scheduler.schedule``: the running requests, then the waiting
    ones), each pass a method that reads the state it needs into locals and writes back what it
    changed."""

    __slots__ = (
        "arr", "busy_s", "computed", "done", "first_token", "free", "held", "max_out", "outputs",
        "params", "preemptions", "prompt", "queued_at", "restarts", "rows", "running",
        "scheduled_at", "waiting",
    )  # fmt: skip

    def __init__(
        self, params: V1Params, arr: list[float], prompt: list[int], max_out: list[int]
    ) -> None:
        n = len(arr)
        self.params, self.arr, self.prompt, self.max_out = params, arr, prompt, max_out
        self.computed = [0] * n
        self.outputs = [0] * n
        self.held = [0] * n
        self.scheduled_at = [math.nan] * n
        self.queued_at = [math.nan] * n
        self.first_token = [math.nan] * n
        self.done = [math.nan] * n
        self.busy_s = [0.0] * n
        self.restarts = [0] * n
        self.free = params.usable_blocks
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.rows: list[tuple[object, ...]] = []
        self.preemptions = 0

    def run(self, clock: StepClock, order: list[int]) -> None:
        """Step after step until every request is done: schedule a step when the engine is
        ready (``gap`` after the last one's outputs, or ``lead`` after the arrival that wakes
        it), with the requests queued by then; its outputs ``body`` later."""
        arr, waiting, running, queued_at = self.arr, self.waiting, self.running, self.queued_at
        computed, rows = self.computed, self.rows
        scheduled_at, busy_s, held, first_token, done = (
            self.scheduled_at, self.busy_s, self.held, self.first_token, self.done
        )  # fmt: skip
        prompt, outputs, max_out = self.prompt, self.outputs, self.max_out
        schedule_running, schedule_waiting = self._schedule_running, self._schedule_waiting
        params = self.params
        budget0, threshold = params.max_num_batched_tokens, params.long_prefill_token_threshold
        n = len(arr)
        nxt = 0  # next arrival, by rank in ``order``
        ready = 0.0  # when the engine could schedule again
        index = 0
        finished = 0
        while finished < n:
            idle = 0.0
            if not running and not waiting:
                if nxt >= n:
                    break
                woke = max(ready, arr[order[nxt]])
                idle = woke - ready if index else math.inf  # before the first: long idle
                start = woke + max(0.0, clock.lead(index))
            else:
                start = ready + max(0.0, clock.gap(index))
            while nxt < n and arr[order[nxt]] <= start:
                waiting.append(order[nxt])
                queued_at[order[nxt]] = max(arr[order[nxt]], ready)
                nxt += 1

            # ---- schedule (vLLM's Scheduler.schedule) ----
            chosen: Chosen = []
            limit = threshold if len(running) + len(waiting) > 1 else 0
            budget, preempted = schedule_running(budget0, limit, chosen)
            if not preempted and waiting and budget > 0:  # new requests: none after preempting
                schedule_waiting(budget, limit, chosen)
            self.preemptions += preempted
            if not chosen:  # every running request preempted: the queue is tried again at once
                if not preempted:
                    raise AssertionError(f"vllm_v1: {len(waiting)} requests can never be scheduled")
                ready = start
                continue

            chunks = tuple((new, computed[r] + new) for r, new, _ in chosen)
            pre = [(r, new) for r, new, ctx in chosen if ctx]
            dec = [(r, new) for r, new, ctx in chosen if not ctx]
            step = Composition(
                len(pre), sum(x for _, x in pre), len(dec), sum(x for _, x in dec), chunks,
                start, idle,
            )  # fmt: skip
            end = start + clock.body(index, step)
            # ---- outputs (vLLM's Scheduler.update_from_output) ----
            for r, new, _ in chosen:
                if math.isnan(scheduled_at[r]):
                    scheduled_at[r] = start
                busy_s[r] += end - start
                computed[r] += new
                if computed[r] >= prompt[r] + outputs[r]:
                    outputs[r] += 1
                    if outputs[r] == 1:
                        first_token[r] = end
                    if outputs[r] >= max_out[r]:
                        done[r] = end
                        self.free += held[r]
                        held[r] = 0
                        running.remove(r)
                        finished += 1
            requests = " ".join(f"{r}:{new}" for r, new, _ in chosen)
            rows.append(
                (index, start, end, *step.key, preempted, len(waiting), len(running), requests)
            )
            index += 1
            ready = end

    def _schedule_running(self, budget: int, limit: int, chosen: Chosen) -> tuple[int, int]:
        """The running requests in their order, each taking what it lacks within the budget;
        where blocks run out the last running request is preempted, until the request fits or
        is itself the one preempted. Returns the budget left and the requests preempted."""
        running, waiting, prompt, outputs = self.running, self.waiting, self.prompt, self.outputs
        computed, held, restarts = self.computed, self.held, self.restarts
        bs, free = self.params.block_size, self.free
        preempted = 0
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            new = prompt[r] + outputs[r] - computed[r]
            if 0 < limit < new:
                new = limit
            new = min(new, budget)
            if new <= 0:
                i += 1
                continue
            fits = True
            while True:
                need = cdiv(computed[r] + new, bs) - held[r]
                if need <= free:
                    break
                victim = running.pop()
                free += held[victim]
                held[victim] = 0
                computed[victim] = 0
                restarts[victim] += 1
                preempted += 1
                waiting.appendleft(victim)
                if victim == r:
                    fits = False
                    break
            if not fits:
                break
            free -= need
            held[r] += need
            chosen.append((r, new, outputs[r] == 0))
            budget -= new
            i += 1
        self.free = free
        return budget, preempted

    def _schedule_waiting(self, budget: int, limit: int, chosen: Chosen) -> None:
        """The waiting requests in queue order while the budget lasts and fewer than
        ``max_num_seqs`` run, each admitted only if the blocks for all its tokens so far are
        free (``scheduler_reserve_full_isl``)."""
        running, waiting, prompt, outputs = self.running, self.waiting, self.prompt, self.outputs
        params, held = self.params, self.held
        bs, seqs, free = params.block_size, params.max_num_seqs, self.free
        while budget > 0 and waiting and len(running) < seqs:
            r = waiting[0]
            total = prompt[r] + outputs[r]
            new = total
            if 0 < limit < new:
                new = limit
            if not params.enable_chunked_prefill and new > budget:
                break
            new = min(new, budget)
            if cdiv(total, bs) > free:  # the whole sequence so far must fit
                break
            need = cdiv(new, bs)
            free -= need
            held[r] = need
            waiting.popleft()
            running.append(r)
            chosen.append((r, new, outputs[r] == 0))
            budget -= new
        self.free = free
