"""vLLM's V1 scheduler as an engine a caller steps (:class:`VllmV1Engine`), its policy written
once over the KV-cache seam (:mod:`.kv_cache`).

It follows vLLM 0.32's ``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule`` and
``update_from_output``) for what a served request meets there with speculative decoding, LoRA,
encoders and KV connectors off and synchronous scheduling (what vLLM runs on CPU):

- **one token budget** (``--max-num-batched-tokens``), spent first on the running requests in
  their order, each taking what it still lacks (a decode: one token; a prefill: the rest of its
  prompt, or of prompt and output after a preemption), capped by the budget and the long-prefill
  threshold (``long_prefill_token_threshold``, 0: off, and only with more than one request);
- **KV blocks** from the cache (:class:`~.kv_cache.KVCacheManager`); a running request allocates
  what its new tokens need; when none are free the **last running request is preempted** (its
  blocks freed, its computed tokens reset: it will recompute prompt and output) and put at the
  head of the queue, until the request fits or is itself the one preempted, which ends the
  running pass;
- **waiting requests** only in a step that preempted nobody, in queue order, while the budget
  lasts and fewer than ``--max-num-seqs`` run; each starts from its cached prefix (none without
  prefix caching) and is admitted only if the blocks for all its tokens so far are free
  (``scheduler_reserve_full_isl``); chunked prefill takes what the budget leaves;
- **after the step**, every request whose computed tokens reached its tokens emits one; one that
  has emitted its ``max_tokens`` finishes and frees its blocks.

Time: a step is scheduled at ``S`` and its outputs are made at ``E = S + body``; a request that
reached the engine by ``S`` is in the queue (vLLM's core reads new requests only between steps).
The next step is scheduled ``gap`` after ``E`` when there is work, else ``lead`` after the next
arrival; the :class:`~.types.StepClock` gives those three per step. A request is queued (the
engine's clock starts) at the ``S`` of the first step after it reached the engine: vLLM's core
takes its input in right before it schedules (``run_busy_loop``: ``_process_input_queue``, then
the step), so a request that came while a step ran is stamped queued after that step's outputs
and the pause behind them, tens of microseconds before the next step's scheduling.

Per-request state lives in a :class:`RequestBook` shared by every engine of a fleet (a request
runs on one engine); each engine keeps its own queue, running list, cache and steps.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

from gpu_simulate_test.simulator.kv_cache import KVCacheManager
from gpu_simulate_test.simulator.types import Chosen, Composition, StepClock, V1Params


class RequestBook:
    """Every request's tokens and times, by request id: what the engines write and the result
    is read from (one per simulation, however many engines)."""

    __slots__ = (
        "added", "arr", "busy_s", "cached_tokens", "computed", "done", "first_token", "max_out",
        "outputs", "prompt", "queued_at", "restarts", "scheduled_at",
    )  # fmt: skip

    def __init__(self, arr: list[float], prompt: list[int], max_out: list[int]) -> None:
        n = len(arr)
        self.arr, self.prompt, self.max_out = arr, prompt, max_out
        self.computed = [0] * n
        self.outputs = [0] * n
        self.scheduled_at = [math.nan] * n
        self.queued_at = [math.nan] * n
        self.first_token = [math.nan] * n
        self.done = [math.nan] * n
        self.busy_s = [0.0] * n
        self.restarts = [0] * n
        self.added = [False] * n
        """Whether the request has reached an engine (it runs once, on one engine)."""
        self.cached_tokens = [-1] * n
        """Tokens served from the cache at the request's first admission (vLLM's
        ``num_cached_tokens``; -1: never admitted)."""


class Stretch:
    """The schedule's rows of a stretch of pure decode steps, kept as one record (expanded by
    :func:`.run.schedule_frame`): every step schedules the same ``requests`` one token each."""

    __slots__ = ("ends", "first_index", "requests", "starts")

    def __init__(self, first_index: int, requests: list[int]) -> None:
        self.first_index = first_index
        self.requests = requests
        self.starts: list[float] = []
        self.ends: list[float] = []


Row = tuple[object, ...] | Stretch
"""A step's row of the schedule, or a stretch's rows."""

Follow = Callable[[int, float], None]
"""Called with (request, when it is sent) when a request with a follower finishes."""


class VllmV1Engine:
    """One vLLM engine: its waiting queue and running list, its KV cache, its clock and its
    steps. A caller :meth:`add`\\ s requests, reads :meth:`next_start` and calls :meth:`step`;
    a router reads :attr:`num_waiting`, :attr:`num_running` and :meth:`kv_usage`. A clock with
    state (one with a ``claim()``, :class:`~.step_model.PredictorClock`) is taken for this
    engine's run: another engine refuses it."""

    __slots__ = (
        "_idle", "_intake_gap", "_start", "after", "book", "clock", "done_log", "finished",
        "follow", "index", "kv", "log_steps", "params", "pending", "preemptions", "ready", "rows",
        "running", "stats", "waiting",
    )  # fmt: skip

    def __init__(
        self,
        params: V1Params,
        book: RequestBook,
        kv: KVCacheManager,
        clock: StepClock,
        after: list[tuple[int, float]] | None = None,
        follow: Follow | None = None,
        log_steps: bool = True,
    ) -> None:
        claim = getattr(clock, "claim", None)  # a clock with state times one run
        if claim is not None:
            claim()
        self.params, self.book, self.kv, self.clock = params, book, kv, clock
        self.log_steps = log_steps
        """Whether each step is kept as a row of the schedule (:attr:`rows`)."""
        self.waiting: deque[int] = deque()
        self.running: list[int] = []
        self.pending: list[tuple[float, int]] = []
        """Arrivals not yet queued, earliest first (ties by request id)."""
        self.rows: list[Row] = []
        self.preemptions = 0
        self.finished = 0
        self.index = 0
        self.ready = 0.0
        """When the engine could schedule again (the last step's outputs)."""
        self.after = after
        """Closed loop (multi-turn sessions): per request, the request sent when it finishes
        (-1: none) and the seconds from its last token to that send."""
        self.follow: Follow = follow or self.add
        """Where a follower goes when it is sent (default: this engine; a fleet: its router)."""
        self.done_log: list[int] | None = None
        """When a list: each request that finishes is appended (a fleet tells its router)."""
        self.stats = {"queries": 0, "hits": 0, "preempted_queries": 0, "preempted_hits": 0}
        """vLLM's ``PrefixCacheStats`` totals, in tokens."""
        self._start: float | None = None
        self._idle = 0.0
        self._intake_gap: Callable[[int], float] | None = getattr(clock, "intake_gap", None)
        """The pause before a busy step that takes in a request, where the clock sets it apart
        (None: :meth:`StepClock.gap` before every busy step)."""

    @property
    def num_waiting(self) -> int:
        """Requests the engine has queued or been sent (vLLM's ``num_waiting_reqs``)."""
        return len(self.waiting) + len(self.pending)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def kv_usage(self) -> float:
        return self.kv.usage()

    def add(self, r: int, at: float) -> None:
        """Request ``r`` reaches the engine at ``at`` (queued at its next step's scheduling);
        once: a request already added to this engine or another of its book is refused."""
        if not 0 <= r < len(self.book.arr) or not math.isfinite(at):
            raise ValueError(
                f"add({r}, {at}): expected a request of the book (0 to {len(self.book.arr) - 1}) "
                "and a finite time in seconds"
            )
        if at < self.book.arr[r]:  # NaN (a closed loop's turn not yet sent): any time
            raise ValueError(
                f"add({r}, {at}): request {r} arrives at {self.book.arr[r]} s (the book's); "
                "it cannot reach the engine before it arrives"
            )
        if self.book.added[r]:  # it would run again, or twice at once
            raise ValueError(
                f"add({r}, {at}): request {r} has reached an engine already (a request runs "
                "once, on one engine)"
            )
        self.book.added[r] = True
        heapq.heappush(self.pending, (at, r))
        if not self.running and not self.waiting:
            self._start = None  # an idle engine wakes for the earliest of its arrivals
        elif self._intake_gap is not None and self._start is not None and at <= self._start:
            # a busy engine's next step, asked before this request was routed to it (a
            # fleet's), takes it in: it pauses as one that does
            self._start = self.ready + self._busy_gap(self.index, self.ready)

    def next_start(self) -> float:
        """When the next step is scheduled (inf: nothing to do until a request is added);
        asks the clock once per step."""
        if self._start is None:
            index = self.index
            if not self.running and not self.waiting:
                if not self.pending:
                    return math.inf
                woke = max(self.ready, self.pending[0][0])
                self._idle = woke - self.ready if index else math.inf  # before the first: long
                self._start = woke + max(0.0, self.clock.lead(index))
            else:
                self._idle = 0.0
                self._start = self.ready + self._busy_gap(index, self.ready)
        return self._start

    def _busy_gap(self, index: int, ready: float) -> float:
        """The pause after a busy step that ended at ``ready``: the clock's, or where a request
        reaches the engine by ``ready`` plus that pause (the next step takes it in), the clock's
        pause before a step that takes one in (``intake_gap``, where it has one)."""
        gap = max(0.0, self.clock.gap(index))
        pending = self.pending
        if self._intake_gap is not None and pending and pending[0][0] <= ready + gap:
            return max(gap, self._intake_gap(index))
        return gap

    def step(self) -> None:
        """Schedule a step at :meth:`next_start` with the requests queued by then, and make its
        outputs ``body`` later (vLLM's ``schedule`` then ``update_from_output``)."""
        start = self._start
        if start is None:
            start = self.next_start()
        if start == math.inf:
            raise ValueError("nothing to step: no request is waiting, running or added")
        idle = self._idle
        self._start = None
        book, waiting, running, pending = self.book, self.waiting, self.running, self.pending
        if pending and pending[0][0] <= start:
            queued_at = book.queued_at
            while pending and pending[0][0] <= start:
                _, r = heapq.heappop(pending)
                waiting.append(r)
                queued_at[r] = start  # stamped as the core takes its input in, then schedules
        chosen: Chosen = []
        chunks: list[tuple[int, int]] = []
        params = self.params
        threshold = params.long_prefill_token_threshold
        limit = threshold if threshold and len(running) + len(waiting) > 1 else 0
        budget, preempted = self._schedule_running(
            params.max_num_batched_tokens, limit, chosen, chunks
        )
        if not preempted and waiting and budget > 0:  # new requests: none after preempting
            self._schedule_waiting(budget, limit, chosen, chunks)
        if preempted:
            self.preemptions += preempted
        if not chosen:  # every running request preempted: the queue is tried again at once
            if not preempted:
                raise AssertionError(f"vllm_v1: {len(waiting)} requests can never be scheduled")
            self.ready = start
            return
        # ---- outputs (vLLM's Scheduler.update_from_output) ----
        computed, scheduled_at, busy_s = book.computed, book.scheduled_at, book.busy_s
        prompt, outputs, max_out = book.prompt, book.outputs, book.max_out
        npre = tpre = ndec = tdec = first = 0
        for r, new, ctx in chosen:
            if ctx:
                npre += 1
                tpre += new
            else:
                ndec += 1
                tdec += new
            if scheduled_at[r] != scheduled_at[r]:  # NaN: never scheduled
                first += 1
        index = self.index
        step = Composition(npre, tpre, ndec, tdec, tuple(chunks), start, idle, first)
        end = start + self.clock.body(index, step)
        scheduled = len(running)  # as vLLM's step record counts them: before any finishes
        for r, new, _ in chosen:
            if scheduled_at[r] != scheduled_at[r]:
                scheduled_at[r] = start
            busy_s[r] += end - start
            done = computed[r] + new
            computed[r] = done
            if done >= prompt[r] + outputs[r]:
                emitted = outputs[r] + 1
                outputs[r] = emitted
                if emitted == 1:
                    book.first_token[r] = end
                if emitted >= max_out[r]:
                    self._finish(r, end)
        if self.log_steps:
            requests = " ".join([f"{r}:{new}" for r, new, _ in chosen])
            self.rows.append(
                (index, start, end, npre, tpre, ndec, tdec, preempted, len(waiting), scheduled,
                 requests)
            )  # fmt: skip
        self.index = index + 1
        self.ready = end

    def advance(self, until: float = math.inf) -> None:
        """Take every step scheduled before ``until`` (inf: until the engine has nothing left):
        the steps, rows and times :meth:`step` takes one by one, with each stretch of pure
        decode steps that nothing can change taken in one pass (:meth:`_stretch`)."""
        decode_body = getattr(self.clock, "decode_body", None)
        while self.next_start() < until:
            if decode_body is None or not self._stretch(decode_body, until):
                self.step()

    def take(self, until: float = math.inf) -> None:
        """The step at :meth:`next_start`, or the stretch of pure decode steps from it, cut
        before ``until`` (what a fleet takes when nothing reads an engine between its steps: a
        stretch ends at its first finish, so nothing it causes is due inside it)."""
        decode_body = getattr(self.clock, "decode_body", None)
        if decode_body is None or not self._stretch(decode_body, until):
            self.step()

    def _stretch(self, decode_body: Callable[[int, float, int, int], float], until: float) -> bool:
        """From the step at :meth:`next_start`: while no request waits or is queued by a step's
        start, every running request decodes one token a step (none finishes before the last
        step, the cache has room: :meth:`~.kv_cache.KVCacheManager.room_for`), steps take the
        clock's ``decode_body`` in order, and the requests' tokens, busy times and blocks are
        updated once at the end, in the order :meth:`step` updates them. False (nothing taken)
        when the next step is no such stretch of at least two steps."""
        running, pending, book = self.running, self.pending, self.book
        start = self._start
        assert start is not None
        n = len(running)
        if self.waiting or not n or n > self.params.max_num_batched_tokens:
            return False
        if pending and pending[0][0] <= start:
            return False
        prompt, outputs, computed, max_out = book.prompt, book.outputs, book.computed, book.max_out
        steps = 1 << 62
        kv_tokens = 0
        for r in running:
            o = outputs[r]
            if not o or computed[r] != prompt[r] + o - 1:
                return False
            steps = min(steps, max_out[r] - o)
            kv_tokens += computed[r]
        steps = self.kv.room_for(running, computed, steps) if steps > 1 else 0
        if steps < 2:
            return False
        record = Stretch(self.index, list(running)) if self.log_steps else None
        clock, index, durations = self.clock, self.index, []
        taken = 0
        while True:
            taken += 1
            end = start + decode_body(index, start, n, kv_tokens + n * taken)
            durations.append(end - start)
            if record is not None:
                record.starts.append(start)
                record.ends.append(end)
            index += 1
            self.ready = end
            if taken == steps:
                self._start = None
                break
            start = end + max(0.0, clock.gap(index))
            if pending and pending[0][0] <= start:
                if self._intake_gap is not None:  # the next step takes a request in
                    start = end + max(start - end, self._intake_gap(index))
                self._start, self._idle = start, 0.0  # the next step's start, asked once
                break
            if start >= until:
                self._start, self._idle = start, 0.0
                break
        self.index = index
        self._close_stretch(taken, durations, end)
        if record is not None:
            self.rows.append(record)
        return True

    def _close_stretch(self, taken: int, durations: list[float], end: float) -> None:
        """A stretch's ``taken`` steps on its requests: tokens, busy times (added step by step,
        as :meth:`step` adds them) and blocks; then those that emitted their last token."""
        running, book, kv = self.running, self.book, self.kv
        computed, outputs, busy_s, max_out = book.computed, book.outputs, book.busy_s, book.max_out
        done = []
        for r in running:
            b = busy_s[r]
            for d in durations:
                b += d
            busy_s[r] = b
            computed[r] += taken
            outputs[r] += taken
            grew = kv.extend(r, computed[r])
            assert grew, "room_for promised the blocks"
            if outputs[r] >= max_out[r]:
                done.append(r)
        for r in done:
            self._finish(r, end)

    def _finish(self, r: int, end: float) -> None:
        """Request ``r`` emitted its last token at ``end``: its blocks freed, it leaves the
        running list, and its follower in a closed loop is sent ``think`` seconds later."""
        self.book.done[r] = end
        self.kv.free(r)
        self.running.remove(r)
        self.finished += 1
        if self.done_log is not None:
            self.done_log.append(r)
        after = self.after
        if after is not None and after[r][0] >= 0:
            nxt, think = after[r]
            self.book.arr[nxt] = end + think
            self.follow(nxt, end + think)

    def _schedule_running(
        self, budget: int, limit: int, chosen: Chosen, chunks: list[tuple[int, int]]
    ) -> tuple[int, int]:
        """The running requests in their order, each taking what it lacks within the budget;
        where blocks run out the last running request is preempted, until the request fits or
        is itself the one preempted. Returns the budget left and the requests preempted."""
        running, waiting, book, kv = self.running, self.waiting, self.book, self.kv
        prompt, outputs, computed, restarts = (
            book.prompt,
            book.outputs,
            book.computed,
            book.restarts,
        )
        extend = kv.extend
        preempted = 0
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            new = prompt[r] + outputs[r] - computed[r]
            if 0 < limit < new:
                new = limit
            if new > budget:
                new = budget
            if new <= 0:
                i += 1
                continue
            upto = computed[r] + new  # never past the request's tokens
            fits = True
            while not extend(r, upto):
                victim = running.pop()
                kv.free(victim)
                computed[victim] = 0
                restarts[victim] += 1
                preempted += 1
                waiting.appendleft(victim)
                if victim == r:
                    fits = False
                    break
            if not fits:
                break
            chosen.append((r, new, outputs[r] == 0))
            chunks.append((new, upto))
            budget -= new
            i += 1
        return budget, preempted

    def _schedule_waiting(
        self, budget: int, limit: int, chosen: Chosen, chunks: list[tuple[int, int]]
    ) -> None:
        """The waiting requests in queue order while the budget lasts and fewer than
        ``max_num_seqs`` run, each from its cached prefix, admitted only if the blocks for all
        its tokens so far are free (``scheduler_reserve_full_isl``)."""
        running, waiting, book, kv, params = (
            self.running,
            self.waiting,
            self.book,
            self.kv,
            self.params,
        )
        prompt, outputs, computed, stats = book.prompt, book.outputs, book.computed, self.stats
        seqs, chunked = params.max_num_seqs, params.enable_chunked_prefill
        while budget > 0 and waiting and len(running) < seqs:
            r = waiting[0]
            total = prompt[r] + outputs[r]
            hit = kv.lookup(r, total - 1)
            new = total - hit
            if 0 < limit < new:
                new = limit
            if not chunked and new > budget:
                break
            new = min(new, budget)
            if not kv.admit(r, total, hit + new):
                break
            if book.restarts[r]:
                stats["preempted_queries"] += total
                stats["preempted_hits"] += hit
            else:
                stats["queries"] += total
                stats["hits"] += hit
                book.cached_tokens[r] = hit
            computed[r] = hit
            waiting.popleft()
            running.append(r)
            chosen.append((r, new, outputs[r] == 0))
            chunks.append((new, hit + new))
            budget -= new
