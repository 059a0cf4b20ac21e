"""Our aggregate loop (:mod:`.event_loop`) as an engine a caller steps: :class:`AggregateEngine`.

Like :class:`~gpu_simulate_test.simulator.engine.VllmV1Engine`, a caller adds requests
(:meth:`~AggregateEngine.add`), reads :meth:`~AggregateEngine.next_start` and takes batches with
:meth:`~AggregateEngine.step` (one) or :meth:`~AggregateEngine.advance` (every batch that starts
before a horizon, runs of decode-only batches in bulk within it); a router reads
:attr:`~AggregateEngine.num_waiting`, :attr:`~AggregateEngine.num_running` and
:meth:`~AggregateEngine.kv_usage`. :func:`.event_loop.run_loop` is one engine given every arrival
and advanced to the end; a caller that steps engines side by side on one clock gets, on each,
the batches it takes alone on its requests (batches are the same floats whether a run of
decodes is taken in bulk, split at a horizon, or one by one).

Time: a batch is formed at the end of the previous one, with the requests that arrived by then
(Vidur orders an arrival at the instant a batch ends before the next batch is formed), or at the
next arrival when the engine has nothing to run; :meth:`~AggregateEngine.step` forms a batch,
times it and ends it.
"""

from __future__ import annotations

import math
import operator
from array import array
from collections.abc import Sequence
from functools import reduce
from heapq import heappop, heappush

import pandas as pd

from gpu_simulate_test.simulator.request_rows import aggregate_loop_rows
from gpu_simulate_test.vidur_simulate.batch_forming import FORMERS
from gpu_simulate_test.vidur_simulate.decode_runs import DecodeRuns
from gpu_simulate_test.vidur_simulate.loop_setup import BatchTimer, LoopParams

COMPACT_AT = 1 << 20
"""Decode batches kept before those no running request was in are dropped."""


class AggregateEngine(DecodeRuns):
    """One replica on our aggregate loop: per request (by arrival rank at this engine), the
    decoding requests as one aggregate, the batches so far. The stepping (:meth:`_go`) owns the
    clock; each phase of a batch is a method that reads the state it needs into locals (the
    loop is hot) and writes back what it changed."""

    __slots__ = (
        "arr", "batch_dec_index", "blocks", "bs", "compact_at", "completes_at", "completion_heap",
        "count", "dec", "dec_base", "decode_tokens", "done_at", "exec_acc", "exec_time",
        "first_decode", "head", "idle", "ids", "last_end", "pre", "pre_acc", "preempt_time",
        "prefill_done", "prefilling", "proc", "prompt_tokens", "release", "sched_at", "scheduled",
        "t", "tail",
    )  # fmt: skip

    def __init__(
        self,
        params: LoopParams,
        timer: BatchTimer,
        prompt_tokens: Sequence[int],
        decode_tokens: Sequence[int],
        record_steps: bool = True,
        compact_at: int = COMPACT_AT,
    ) -> None:
        """Every request's prompt and decode tokens by request id, known up front (each request
        is added at most once: the per-request records are kept for all of them); with
        ``record_steps`` false, batches are counted but their shapes not kept."""
        if params.scheduler not in FORMERS:
            raise ValueError(f"no fast event loop for scheduler {params.scheduler!r}")
        n = len(prompt_tokens)
        self.prompt_tokens, self.decode_tokens = prompt_tokens, decode_tokens
        self.record_steps, self.compact_at = record_steps, compact_at
        # by arrival rank at this engine: its request id, arrival and tokens
        self.ids = [0] * n
        self.arr = [0.0] * n
        self.pre = [0] * n
        self.dec = [0] * n
        self.count = 0  # requests added
        sched = FORMERS[params.scheduler](params, self.pre, self.arr)  # forms batches, KV blocks
        self.sched, self.release = sched, sched.free
        self.tracks = sched.tracks_decode_blocks  # orca reserves a sequence's blocks at admission
        self.bs, self.num_blocks = params.block_size, params.num_blocks
        self.blocks, self.blocks_due = sched.blocks, sched.due
        self.g, self.time_of, self.jitter = timer.granularity, timer.time, timer.jitter

        # the clock: the next batch is formed at t (the last batch's end), or, idle, at the
        # next arrival; the queue is ranks head..tail-1, sarathi's running prefills its order
        self.t = -math.inf
        self.idle = True
        self.head = self.tail = 0
        self.prefilling: list[int] = []

        # per request (by arrival rank)
        self.proc = [0] * n  # processed tokens while in prefill
        self.sched_at = [0.0] * n
        self.scheduled = [False] * n
        self.last_end: list[float] = [0] * n  # Vidur's 0 = never
        self.exec_acc: list[float] = [0] * n
        self.pre_acc: list[float] = [0] * n
        self.prefill_done: list[float] = [0] * n
        self.done_at = [0.0] * n
        self.exec_time = [0.0] * n
        self.preempt_time: list[float] = [0] * n
        self.first_decode = [0] * n

        # the requests past their prefill, as one aggregate
        self.num_dec = 0
        self.processed_sum = 0  # their processed tokens
        self.next_dec = 0  # index of the next batch they run in
        # per decode batch from index dec_base on: its time, start and wait since the last one
        self.dec_exec, self.dec_gap, self.dec_sched = array("d"), array("d"), array("d")
        self.dec_base = 0
        self.last_dec_end = 0.0
        self.completes_at: dict[int, list[int]] = {}
        self.completion_heap: list[int] = []  # the keys of completes_at
        self.batch_dec_index = -1  # the decode index of the batch in flight

        self.batches = 0
        self.out_size, self.out_prefill, self.out_decode = array("q"), array("q"), array("q")
        self.out_time = array("d")

    @property
    def num_waiting(self) -> int:
        """Requests added and not yet admitted (queued, or arriving later)."""
        return self.count - self.head

    @property
    def num_running(self) -> int:
        """Requests admitted and not finished (prefilling or decoding)."""
        return self.num_dec + len(self.prefilling)

    @property
    def finished(self) -> int:
        return self.head - self.num_dec - len(self.prefilling)

    def kv_usage(self) -> float:
        """The share of the KV blocks allocated (Vidur's accounting)."""
        return self.sched.allocated / self.num_blocks

    def add(self, r: int, at: float) -> None:
        """Request ``r`` arrives at ``at``: no earlier than the requests added before it, and
        before the engine takes a batch that starts after ``at``."""
        rank = self.count
        if rank and at < self.arr[rank - 1]:
            raise ValueError(f"request {r} arrives at {at}, before the last one added")
        self.ids[rank] = r
        self.arr[rank] = at
        self.pre[rank] = self.prompt_tokens[r]
        self.dec[rank] = self.decode_tokens[r]
        self.count = rank + 1

    def next_start(self) -> float:
        """When the next batch is formed (inf: nothing to do until a request is added)."""
        if not self.idle:
            return self.t
        if self.tail >= self.count:
            return math.inf
        return max(self.arr[self.tail], self.t)

    def step(self) -> None:
        """Form a batch at :meth:`next_start`, time it and end it. Where the queue's head
        cannot be admitted and nothing runs, nothing is formed: the engine waits for its next
        arrival."""
        self._go(math.inf, True)

    def advance(self, until: float = math.inf) -> None:
        """Take every batch that starts before ``until`` (inf: until the engine has nothing
        left): the batches :meth:`step` takes one by one, with each run of decode-only batches
        that no arrival changes taken in bulk, up to the batch ``until`` falls in."""
        self._go(until, False)

    def _go(self, until: float, one: bool) -> None:
        """Batch after batch while they start before ``until`` (``one``: a single formation,
        no bulk run): each is formed at the last one's end (or at the next arrival when there
        is nothing to run), timed, and ended (its requests move on)."""
        arr, form, proc, count = self.arr, self.sched.form, self.proc, self.count
        heap, completes_at = self.completion_heap, self.completes_at
        decode_run = self._steady_decodes if self.jitter is None else self._jittered_decodes
        t, idle, head, tail, prefilling = self.t, self.idle, self.head, self.tail, self.prefilling
        while True:
            if idle:
                if tail >= count:
                    break
                at = arr[tail]
                if at < t:
                    at = t  # arrived while the last batch ran: formed at its end
                if at >= until:
                    break
                t = at
            elif t >= until:
                break
            while tail < count and arr[tail] <= t:  # queued before the batch is formed
                tail += 1

            # ---- form the next batch at time t (the scheduler's own piece) ----
            entries, batch_decodes, total_q, skipped_sorted, head = form(
                head, tail, self.num_dec, self.next_dec, prefilling, proc, t
            )
            if not entries and not batch_decodes:
                prefilling = skipped_sorted
                idle = True  # until the next arrival
                if one:
                    break
                continue

            # ---- a run of decode-only batches that end without an event: in bulk ----
            carried = -1.0  # the time of the batch the run stopped at, when it drew it
            if batch_decodes and not entries and not prefilling and not one:
                while heap[0] not in completes_at:  # drop indices already done
                    heappop(heap)
                # an empty queue: the run stops at the batch an arrival lands in; a queue whose
                # head cannot be admitted stays so (same decodes, blocks only taken) until then;
                # either way no further than the batch the horizon lands in
                stop = arr[tail] if head == tail and tail < count else math.inf
                t, carried = decode_run(t, heap[0], until if until < stop else stop)
                batch_decodes = self.num_dec
            e = self._start_batch(t, entries, batch_decodes, total_q, carried)
            t_end = t + e

            # ---- the batch ends at t_end: stage end, then batch end ----
            entering: list[int] = []
            still: list[int] = []
            if entries:
                self._end_chunks(t_end, e, entries, entering, still)
            if batch_decodes:  # each took a token; those at their last are done
                self.processed_sum += batch_decodes
                done = completes_at.pop(self.batch_dec_index, None)
                if done:
                    self._end_decodes(t_end, done)
            if entering:
                self._enter_decode(entering)
            prefilling = skipped_sorted + still  # only Sarathi has prefills left running
            t = t_end
            idle = not self.num_dec and not prefilling and head == tail
            if one:
                break
        self.t, self.idle, self.head, self.tail, self.prefilling = t, idle, head, tail, prefilling

    def unfinished(self) -> int:
        """Requests added and not done: any left when the engine has nothing to do can never
        be scheduled."""
        return self.count - self.finished

    def requests(self) -> pd.DataFrame:
        """The rows of Vidur's ``request_metrics.csv`` the stage reads, for the requests added,
        by request id."""
        k = self.count
        return aggregate_loop_rows(
            self.ids[:k], self.arr[:k], self.pre[:k], self.dec[:k], self.sched_at[:k],
            self.prefill_done[:k], self.done_at[:k], self.exec_time[:k], self.preempt_time[:k],
        )  # fmt: skip

    def _end_chunks(
        self,
        t_end: float,
        e: float,
        entries: list[tuple[int, int]],
        entering: list[int],
        still: list[int],
    ) -> None:
        """The batch's prefill chunks end at ``t_end``: a request whose prompt is done has its
        first token (and is done, or ``entering`` the decodes), the others are ``still``
        prefilling."""
        pre, dec, proc, exec_acc = self.pre, self.dec, self.proc, self.exec_acc
        last_end, prefill_done = self.last_end, self.prefill_done
        for r, q in entries:
            exec_acc[r] = exec_acc[r] + e
            last_end[r] = t_end
            p = proc[r] + q
            if p == pre[r]:
                p += 1
                if prefill_done[r] == 0:
                    prefill_done[r] = t_end
                if p == pre[r] + dec[r]:
                    self.done_at[r] = t_end
                    self.exec_time[r] = exec_acc[r]
                    self.preempt_time[r] = self.pre_acc[r]
                    self.release(r)
                else:
                    proc[r] = p
                    entering.append(r)
            else:
                proc[r] = p
                still.append(r)

    def _end_decodes(self, t_end: float, done: list[int]) -> None:
        """The batch's decodes end at ``t_end`` and ``done`` had their last: they complete,
        their times summed from the decode batches' shared record in Vidur's order."""
        index = self.batch_dec_index
        pre, dec, first_decode, base = self.pre, self.dec, self.first_decode, self.dec_base
        dec_exec, dec_gap, dec_sched = self.dec_exec, self.dec_gap, self.dec_sched
        exec_acc, pre_acc, last_end = self.exec_acc, self.pre_acc, self.last_end
        done_at, exec_time, preempt_time = self.done_at, self.exec_time, self.preempt_time
        release, add = self.release, operator.add
        jc = index - base
        for r in done:
            done_at[r] = t_end
            j0 = first_decode[r] - base
            exec_time[r] = reduce(add, dec_exec[j0 : jc + 1], exec_acc[r])
            preempt_time[r] = reduce(
                add, dec_gap[j0 + 1 : jc + 1], pre_acc[r] + (dec_sched[j0] - last_end[r])
            )
            release(r)
            self.num_dec -= 1
            self.processed_sum -= pre[r] + dec[r]

    def _enter_decode(self, entering: list[int]) -> None:
        """Requests whose prefill just ended join the decodes: when each completes, and (where
        decodes take blocks) at which decode batch each needs its next KV block."""
        pre, dec, first_decode = self.pre, self.dec, self.first_decode
        completes_at, heap = self.completes_at, self.completion_heap
        tracks, blocks, blocks_due = self.tracks, self.blocks, self.blocks_due
        bs, next_dec = self.bs, self.next_dec
        for r in entering:
            self.num_dec += 1
            processed = pre[r] + 1
            self.processed_sum += processed
            first_decode[r] = next_dec
            total = pre[r] + dec[r]
            done_index = next_dec + dec[r] - 2
            if done_index in completes_at:
                completes_at[done_index].append(r)
            else:
                completes_at[done_index] = [r]
                heappush(heap, done_index)
            if not tracks:
                continue
            # a new block each time processed tokens pass a multiple of block_size
            held = blocks[r]
            point = held * bs + 1
            while point <= total - 1:
                step = next_dec + point - processed
                blocks_due[step] = blocks_due.get(step, 0) + 1
                held += 1
                point += bs
            blocks[r] = held  # freed at completion

    def _start_batch(
        self,
        t: float,
        entries: list[tuple[int, int]],
        batch_decodes: int,
        total_q: int,
        carried: float,
    ) -> float:
        """The batch starts at ``t``: its time (``carried`` where a decode run drew it, else
        from its shape as Vidur's predictor reads it, with the jitter draw), each request's
        first batch and the time it waited since its last, the decodes' record of this batch,
        and the batch's shape. Returns its time."""
        chunk_tokens = 0
        if carried >= 0:
            e = carried  # a decode run's batch: no prefills
        else:
            g, proc = self.g, self.proc
            ones = batch_decodes
            ones_kv = self.processed_sum + batch_decodes if batch_decodes else 0  # vllm: none
            prefills: list[tuple[int, int]] = []
            for r, q in entries:
                if q == 1:
                    ones += 1
                    ones_kv += proc[r] + 1
                else:
                    kv = proc[r] + q
                    prefills.append(((kv + g - 1) // g * g, q))
                    chunk_tokens += q
            mean_kv = 0
            if ones:
                mean_kv = int(ones_kv / ones)
                mean_kv = (mean_kv + g - 1) // g * g
            e = self.time_of(total_q, ones, mean_kv, tuple(prefills))
            if self.jitter is not None:
                e = e * self.jitter()
        t_end = t + e
        if entries:
            scheduled, sched_at, last_end, pre_acc = (
                self.scheduled, self.sched_at, self.last_end, self.pre_acc
            )  # fmt: skip
            for r, _ in entries:
                if not scheduled[r]:
                    scheduled[r] = True
                    sched_at[r] = t
                if last_end[r] == 0:
                    pre_acc[r] = 0
                else:
                    pre_acc[r] = pre_acc[r] + (t - last_end[r])
        if batch_decodes:
            self.batch_dec_index = self.next_dec
            self.next_dec += 1
            self.dec_exec.append(e)
            self.dec_sched.append(t)
            self.dec_gap.append(t - self.last_dec_end)
            self.last_dec_end = t_end
        self.batches += 1
        if self.record_steps:
            self.out_size.append(batch_decodes + len(entries))
            self.out_prefill.append(chunk_tokens)
            self.out_decode.append(batch_decodes)
            self.out_time.append(t_end - t)
        if len(self.dec_exec) > self.compact_at:
            self._compact()
        return e

    def _compact(self) -> None:
        """Drop the decode batches no running request was in."""
        oldest = min(
            (self.first_decode[r] for waiting in self.completes_at.values() for r in waiting),
            default=self.next_dec,
        )
        drop = oldest - self.dec_base
        del self.dec_exec[:drop], self.dec_sched[:drop], self.dec_gap[:drop]
        self.dec_base = oldest
