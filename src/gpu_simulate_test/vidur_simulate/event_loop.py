"""A faster event loop that makes Vidur's scheduling decisions batch for batch.

Vidur's ``Simulator.run`` pops seven kinds of event objects from a heap, and every batch walks
every running request through half a dozen methods (scheduling, stage start, stage end, batch end,
memory accounting). Most of that is the same for every request in a batch: a request past its
prefill gets one query token per batch, in every batch, until it finishes. This loop keeps those
requests as one aggregate (how many, the sum of their KV sizes) and handles a request on its own
only when something happens to it (a prefill chunk, a new KV block, its completion), so a
batch costs a few dictionary operations instead of a few per request.

What it reproduces (one replica, one pipeline stage, the round-robin global scheduler; the
``sarathi``, ``vllm`` and fixed ``orca`` replica schedulers; Vidur 0.0.26):

- **the order of events**: Vidur orders events by time, then by creation, so requests arriving
  at the instant a batch ends are queued before the next batch is formed;
- **each scheduler's batch**, formed by one class per scheduler over a shared KV-block base
  (:mod:`.batch_forming`, as Vidur has one replica scheduler class per scheduler), including
  Sarathi's order of running prefills (a prefill that got no chunk budget moves ahead of those
  that did) and the KV-block accounting that gates admission (the watermark, one block per
  ``block_size`` decoded tokens);
- **each batch's execution time**: Vidur's own predictor is called with a batch of the same
  shape (its inputs are the total query tokens, the decodes' count and rounded mean KV size and
  each prefill chunk with its rounded KV size), memoized on that shape; the engine overhead and
  the jitter draw are applied per batch as :class:`LocalRFExecutionTimePredictor` applies them;
- **every per-request number** the stage reads, with Vidur's expressions and float operations in
  Vidur's order: a request's execution time is the sequential sum of its batches' times (its
  decode batches summed from one shared record), so the output is the same to the bit
  (``tests/unit/test_vidur_event_loop.py`` compares it with Vidur's loop).

What it does not: KV-cache preemption (a request restarted for lack of blocks; Vidur 0.0.26
then fails its own assertion), more than one replica or stage.
:func:`.loop_setup.unsupported_reason` says when the loop applies, and the loop raises
:class:`.loop_setup.KvCacheExhausted` the moment a decode batch could run out of blocks, so the
caller runs Vidur's own loop instead.
"""

from __future__ import annotations

import math
import operator
from array import array
from bisect import bisect_left
from dataclasses import dataclass
from functools import reduce
from heapq import heappop, heappush
from itertools import accumulate, repeat

import numpy as np
import pandas as pd

from gpu_simulate_test.simulator.request_rows import aggregate_loop_rows
from gpu_simulate_test.vidur_simulate.batch_forming import FORMERS
from gpu_simulate_test.vidur_simulate.loop_setup import (
    BatchTimer,
    KvCacheExhausted,
    LoopParams,
)

COMPACT_AT = 1 << 20
"""Decode batches kept before those no running request was in are dropped."""


@dataclass
class LoopResult:
    """Vidur's per-request rows and per-batch shapes, as :class:`LeanMetrics` records them."""

    requests: pd.DataFrame
    """The rows of Vidur's ``request_metrics.csv`` the stage reads, by request id."""
    num_batches: int
    batch_ids: np.ndarray
    batch_size: np.ndarray
    batch_prefill_tokens: np.ndarray
    batch_decode_tokens: np.ndarray
    batch_time_s: np.ndarray


def run_loop(
    params: LoopParams,
    timer: BatchTimer,
    arrived_at: np.ndarray,
    prefill_tokens: np.ndarray,
    decode_tokens: np.ndarray,
    first_batch_id: int = 0,
    record_steps: bool = True,
) -> LoopResult:
    """Simulate requests (row ``i`` is Vidur's request id ``i``) on one replica; with
    ``record_steps`` false, batches are counted but their shapes not kept."""
    order = np.argsort(np.asarray(arrived_at, dtype=float), kind="stable")
    arr: list[float] = [float(x) for x in np.asarray(arrived_at, dtype=float)[order]]
    pre: list[int] = [int(x) for x in np.asarray(prefill_tokens)[order]]
    dec: list[int] = [int(x) for x in np.asarray(decode_tokens)[order]]
    if params.scheduler not in FORMERS:
        raise ValueError(f"no fast event loop for scheduler {params.scheduler!r}")
    loop = _Loop(params, timer, arr, pre, dec, record_steps)
    loop.run()
    return _result(order.tolist(), loop, first_batch_id)


class _Loop:
    """One simulation's state: per request (by arrival rank), the decoding requests as one
    aggregate, the batches so far. :meth:`run` owns the clock; each phase of a batch is a
    method that reads the state it needs into locals (the loop is hot) and writes back what
    it changed."""

    __slots__ = (
        "arr", "batch_dec_index", "batches", "blocks", "blocks_due", "bs", "completes_at",
        "completion_heap", "dec", "dec_base", "dec_exec", "dec_gap", "dec_sched", "done_at",
        "exec_acc", "exec_time", "first_decode", "g", "jitter", "last_dec_end", "last_end", "n",
        "next_dec", "num_blocks", "num_dec", "out_decode", "out_prefill", "out_size", "out_time",
        "pre", "pre_acc", "preempt_time", "prefill_done", "proc", "processed_sum", "record_steps",
        "release", "sched", "sched_at", "scheduled", "time_of", "tracks",
    )  # fmt: skip

    def __init__(
        self,
        params: LoopParams,
        timer: BatchTimer,
        arr: list[float],
        pre: list[int],
        dec: list[int],
        record_steps: bool,
    ) -> None:
        n = len(arr)
        self.arr, self.pre, self.dec, self.n = arr, pre, dec, n
        self.record_steps = record_steps
        sched = FORMERS[params.scheduler](params, pre, arr)  # forms batches, keeps KV blocks
        self.sched, self.release = sched, sched.free
        self.tracks = sched.tracks_decode_blocks  # orca reserves a sequence's blocks at admission
        self.bs, self.num_blocks = params.block_size, params.num_blocks
        self.blocks, self.blocks_due = sched.blocks, sched.due
        self.g, self.time_of, self.jitter = timer.granularity, timer.time, timer.jitter

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

    def run(self) -> None:
        """Batch after batch until every request is done: a batch ends (its requests move on),
        the next is formed at once, or at the next arrival when there is nothing to run."""
        arr, n, form, proc = self.arr, self.n, self.sched.form, self.proc
        heap, completes_at = self.completion_heap, self.completes_at
        decode_run = self._steady_decodes if self.jitter is None else self._jittered_decodes
        t = t_end = e = 0.0
        busy = False
        head = tail = 0  # the replica's request queue is ranks head..tail-1
        prefilling: list[int] = []  # sarathi's running prefills, in its order
        entries: list[tuple[int, int]] = []
        skipped_sorted: list[int] = []
        batch_decodes = 0
        while True:
            if busy:
                while tail < n and arr[tail] <= t_end:  # queued before the batch ends
                    tail += 1
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
                busy = False
            else:
                if tail >= n:
                    break
                t = arr[tail]
                tail += 1
                while tail < n and arr[tail] == t:
                    tail += 1

            # ---- form the next batch at time t (the scheduler's own piece) ----
            entries, batch_decodes, total_q, skipped_sorted, head = form(
                head, tail, self.num_dec, self.next_dec, prefilling, proc, t
            )
            if not entries and not batch_decodes:
                prefilling = skipped_sorted
                continue  # idle until the next arrival

            # ---- a run of decode-only batches that end without an event: in bulk ----
            carried = -1.0  # the time of the batch the run stopped at, when it drew it
            if batch_decodes and not entries and not prefilling:
                while heap[0] not in completes_at:  # drop indices already done
                    heappop(heap)
                # an empty queue: the run stops at the batch an arrival lands in; a queue whose
                # head cannot be admitted stays so (same decodes, blocks only taken) until then
                next_arr = arr[tail] if head == tail and tail < n else math.inf
                t, carried = decode_run(t, heap[0], next_arr)
                batch_decodes = self.num_dec
            e = self._start_batch(t, entries, batch_decodes, total_q, carried)
            t_end = t + e
            busy = True

        if head < n or self.num_dec or prefilling:
            pending = (n - head) + self.num_dec + len(prefilling)
            raise AssertionError(f"Simulation ended with {pending} pending requests")

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

    def _steady_decodes(self, t: float, done_index: int, next_arr: float) -> tuple[float, float]:
        """Decode-only batches from ``t`` until decode batch ``done_index`` (the next completion)
        or the one ``next_arr`` lands in, without the per-batch events; returns the time the
        run stopped at and, when it stopped at a batch it already timed, that batch's time
        (else -1). Without jitter the decodes' mean KV size grows by one a batch, so the
        prediction holds until it crosses a multiple of the granularity: each such stretch of
        equal batches is added at once."""
        num_dec, processed_sum, next_dec = self.num_dec, self.processed_sum, self.next_dec
        g, time_of, sched, blocks_due = self.g, self.time_of, self.sched, self.blocks_due
        tracks, num_blocks, record_steps = self.tracks, self.num_blocks, self.record_steps
        dec_exec, dec_sched, dec_gap = self.dec_exec, self.dec_sched, self.dec_gap
        last_dec_end, batches = self.last_dec_end, self.batches
        carried = -1.0
        while next_dec < done_index:
            mean = int((processed_sum + num_dec) / num_dec)
            rounded = (mean + g - 1) // g * g
            e0 = time_of(num_dec, num_dec, rounded, ())
            length = min(rounded - mean + 1, done_index - next_dec)
            ends = list(accumulate(repeat(e0, length), initial=t))
            k = bisect_left(ends, next_arr, 1) - 1  # batches ending before the arrival
            first, last = next_dec + 1, next_dec + k
            due = sum(map(blocks_due.pop, range(first, last + 1), repeat(0, k)))
            if tracks and num_blocks - sched.allocated - due < 1:
                free = num_blocks - sched.allocated
                raise KvCacheExhausted(ends[k], num_dec, due, free, num_blocks)
            sched.allocated += due
            if k:
                dec_exec.extend(repeat(e0, k))
                dec_sched.extend(ends[:k])
                dec_gap.append(t - last_dec_end)
                dec_gap.extend(repeat(0.0, k - 1))
                batches += k
                if record_steps:
                    self.out_size.extend(repeat(num_dec, k))
                    self.out_prefill.extend(repeat(0, k))
                    self.out_decode.extend(repeat(num_dec, k))
                    self.out_time.extend(map(operator.sub, ends[1 : k + 1], ends[:k]))
                processed_sum += num_dec * k
                next_dec += k
                t = last_dec_end = ends[k]
            if k < length:  # an arrival lands in the next batch
                carried = e0
                break
        self.processed_sum, self.next_dec = processed_sum, next_dec
        self.last_dec_end, self.batches = last_dec_end, batches
        return t, carried

    def _jittered_decodes(self, t: float, done_index: int, next_arr: float) -> tuple[float, float]:
        """:meth:`_steady_decodes` with jitter: one batch at a time, a draw per batch, as
        Vidur's predictor draws."""
        num_dec, processed_sum, next_dec = self.num_dec, self.processed_sum, self.next_dec
        g, time_of, jitter, sched = self.g, self.time_of, self.jitter, self.sched
        tracks, record_steps = self.tracks, self.record_steps
        dec_exec, dec_sched, dec_gap = self.dec_exec, self.dec_sched, self.dec_gap
        last_dec_end, batches = self.last_dec_end, self.batches
        assert jitter is not None
        carried = -1.0
        while next_dec < done_index:
            mean = int((processed_sum + num_dec) / num_dec)
            rounded = (mean + g - 1) // g * g
            e = time_of(num_dec, num_dec, rounded, ()) * jitter()
            t_end = t + e
            if next_arr <= t_end:
                carried = e
                break
            dec_exec.append(e)
            dec_sched.append(t)
            dec_gap.append(t - last_dec_end)
            last_dec_end = t_end
            batches += 1
            if record_steps:
                self.out_size.append(num_dec)
                self.out_prefill.append(0)
                self.out_decode.append(num_dec)
                self.out_time.append(t_end - t)
            processed_sum += num_dec
            next_dec += 1
            t = t_end
            if tracks:
                sched.grow_decodes(next_dec, t, num_dec)
        self.processed_sum, self.next_dec = processed_sum, next_dec
        self.last_dec_end, self.batches = last_dec_end, batches
        return t, carried

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
        if len(self.dec_exec) > COMPACT_AT:
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


def _result(ids: list[int], loop: _Loop, first_batch_id: int) -> LoopResult:
    """The loop's records as Vidur's request rows and its batches' shapes."""
    requests = aggregate_loop_rows(
        ids, loop.arr, loop.pre, loop.dec, loop.sched_at, loop.prefill_done, loop.done_at,
        loop.exec_time, loop.preempt_time,
    )  # fmt: skip
    return LoopResult(
        requests=requests,
        num_batches=loop.batches,
        batch_ids=np.arange(first_batch_id, first_batch_id + len(loop.out_size), dtype=np.int64),
        batch_size=np.frombuffer(loop.out_size, dtype=np.int64),
        batch_prefill_tokens=np.frombuffer(loop.out_prefill, dtype=np.int64),
        batch_decode_tokens=np.frombuffer(loop.out_decode, dtype=np.int64),
        batch_time_s=np.frombuffer(loop.out_time, dtype=np.float64),
    )
