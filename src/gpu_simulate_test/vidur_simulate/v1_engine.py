"""The state and passes of vLLM's V1 scheduler between steps (:mod:`.vllm_v1`), prefix caching
off: KV blocks counted, not named."""

from __future__ import annotations

import heapq
import math
from collections import deque

from gpu_simulate_test.vidur_simulate.v1_types import Chosen, Composition, StepClock, V1Params, cdiv


class V1Engine:
    """The scheduler's state between steps: per request (by id) its tokens, blocks and times,
    the waiting queue and the running list (vLLM's), the free blocks and the steps so far.
    :meth:`run` owns the clock, a step's outputs (vLLM's ``Scheduler.update_from_output``) and
    the order of its scheduling (``Scheduler.schedule``: the running requests, then the waiting
    ones), each pass a method that reads the state it needs into locals and writes back what it
    changed."""

    __slots__ = (
        "after", "arr", "busy_s", "computed", "done", "first_token", "free", "held", "max_out",
        "outputs", "params", "preemptions", "prompt", "queued_at", "restarts", "rows", "running",
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
        self.after: list[tuple[int, float]] | None = None
        """Closed loop (multi-turn sessions): per request, the request sent when it finishes
        (-1: none) and the seconds from its last token to that send."""

    def release(self, r: int) -> None:
        """A finished request's blocks go back to the pool."""
        self.free += self.held[r]
        self.held[r] = 0

    def run(self, clock: StepClock, order: list[int]) -> None:
        """Step after step until every request is done: schedule a step when the engine is
        ready (``gap`` after the last one's outputs, or ``lead`` after the arrival that wakes
        it), with the requests queued by then; its outputs ``body`` later."""
        arr, waiting, running, queued_at = self.arr, self.waiting, self.running, self.queued_at
        computed, rows = self.computed, self.rows
        scheduled_at, busy_s, first_token, done = (
            self.scheduled_at, self.busy_s, self.first_token, self.done
        )  # fmt: skip
        prompt, outputs, max_out = self.prompt, self.outputs, self.max_out
        schedule_running, schedule_waiting = self._schedule_running, self._schedule_waiting
        params = self.params
        budget0, threshold = params.max_num_batched_tokens, params.long_prefill_token_threshold
        n = len(arr)
        after = self.after
        # arrivals not yet queued, earliest first (ties by request id, as ``order`` ranks them)
        pending = [(arr[r], r) for r in order if not math.isnan(arr[r])]
        heapq.heapify(pending)
        release, heappush, heappop = self.release, heapq.heappush, heapq.heappop
        ready = 0.0  # when the engine could schedule again
        index = 0
        finished = 0
        while finished < n:
            idle = 0.0
            if not running and not waiting:
                if not pending:
                    break
                woke = max(ready, pending[0][0])
                idle = woke - ready if index else math.inf  # before the first: long idle
                start = woke + max(0.0, clock.lead(index))
            else:
                start = ready + max(0.0, clock.gap(index))
            while pending and pending[0][0] <= start:
                at, r = heappop(pending)
                waiting.append(r)
                queued_at[r] = max(at, ready)

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
            first = sum(1 for r, _, _ in chosen if scheduled_at[r] != scheduled_at[r])  # NaN
            step = Composition(
                len(pre), sum(x for _, x in pre), len(dec), sum(x for _, x in dec), chunks,
                start, idle, first,
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
                        release(r)
                        running.remove(r)
                        finished += 1
                        if after is not None and after[r][0] >= 0:
                            nxt, think = after[r]
                            arr[nxt] = end + think
                            heappush(pending, (arr[nxt], nxt))
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
