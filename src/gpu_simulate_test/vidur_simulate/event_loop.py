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
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.vidur_simulate.batch_forming import FORMERS
from gpu_simulate_test.vidur_simulate.loop_setup import (
    BatchTimer,
    KvCacheExhausted,
    LoopParams,
)
from gpu_simulate_test.vidur_simulate.metrics import VIDUR_ID

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
    n = len(arrived_at)
    order = np.argsort(np.asarray(arrived_at, dtype=float), kind="stable")
    arr: list[float] = [float(x) for x in np.asarray(arrived_at, dtype=float)[order]]
    pre: list[int] = [int(x) for x in np.asarray(prefill_tokens)[order]]
    dec: list[int] = [int(x) for x in np.asarray(decode_tokens)[order]]
    ids = order.tolist()

    if params.scheduler not in FORMERS:
        raise ValueError(f"no fast event loop for scheduler {params.scheduler!r}")
    sched = FORMERS[params.scheduler](params, pre, arr)  # forms batches, keeps the KV blocks
    form, release = sched.form, sched.free
    tracks = sched.tracks_decode_blocks  # orca reserves a sequence's blocks at admission
    bs, num_blocks = params.block_size, params.num_blocks
    blocks, blocks_due = sched.blocks, sched.due
    g = timer.granularity
    time_of, jitter = timer.time, timer.jitter

    # per request (by arrival rank)
    proc = [0] * n  # processed tokens while in prefill
    sched_at = [0.0] * n
    scheduled = [False] * n
    last_end: list[float] = [0] * n  # Vidur's 0 = never
    exec_acc: list[float] = [0] * n
    pre_acc: list[float] = [0] * n
    prefill_done: list[float] = [0] * n
    done_at = [0.0] * n
    exec_time = [0.0] * n
    preempt_time: list[float] = [0] * n
    first_decode = [0] * n

    # the requests past their prefill, as one aggregate
    num_dec = 0
    processed_sum = 0  # their processed tokens
    next_dec = 0  # index of the next batch they run in
    # per decode batch from index dec_base on: its time, start and wait since the last one
    dec_exec, dec_gap, dec_sched = array("d"), array("d"), array("d")
    dec_base = 0
    last_dec_end = 0.0
    completes_at: dict[int, list[int]] = {}
    completion_heap: list[int] = []  # the keys of completes_at

    prefilling: list[int] = []  # sarathi's running prefills, in its order
    head = 0  # the replica's request queue is ranks head..tail-1
    tail = 0

    out_size, out_prefill, out_decode = array("q"), array("q"), array("q")
    out_time = array("d")
    batches = 0
    add = operator.add

    def enter_decode(r: int) -> None:
        nonlocal num_dec, processed_sum
        num_dec += 1
        processed = pre[r] + 1
        processed_sum += processed
        first_decode[r] = next_dec
        total = pre[r] + dec[r]
        done_index = next_dec + dec[r] - 2
        if done_index in completes_at:
            completes_at[done_index].append(r)
        else:
            completes_at[done_index] = [r]
            heappush(completion_heap, done_index)
        if not tracks:
            return
        # a new block each time processed tokens pass a multiple of block_size
        held = blocks[r]
        point = held * bs + 1
        while point <= total - 1:
            step = next_dec + point - processed
            blocks_due[step] = blocks_due.get(step, 0) + 1
            held += 1
            point += bs
        blocks[r] = held  # freed at completion

    t = 0.0
    busy = False
    t_end = 0.0
    entries: list[tuple[int, int]] = []
    entering: list[int] = []
    still: list[int] = []
    skipped_sorted: list[int] = []
    batch_decodes = 0
    batch_dec_index = -1
    e = 0.0
    while True:
        if busy:
            while tail < n and arr[tail] <= t_end:  # queued before the batch ends
                tail += 1
            # ---- the batch ends at t_end: stage end, then batch end ----
            for r, q in entries:
                exec_acc[r] = exec_acc[r] + e
                last_end[r] = t_end
                p = proc[r] + q
                if p == pre[r]:
                    p += 1
                    if prefill_done[r] == 0:
                        prefill_done[r] = t_end
                    if p == pre[r] + dec[r]:
                        done_at[r] = t_end
                        exec_time[r] = exec_acc[r]
                        preempt_time[r] = pre_acc[r]
                        release(r)
                    else:
                        proc[r] = p
                        entering.append(r)
                else:
                    proc[r] = p
                    still.append(r)
            if batch_decodes:
                processed_sum += batch_decodes
                for r in completes_at.pop(batch_dec_index, ()):
                    done_at[r] = t_end
                    j0 = first_decode[r] - dec_base
                    jc = batch_dec_index - dec_base
                    exec_time[r] = reduce(add, dec_exec[j0 : jc + 1], exec_acc[r])
                    preempt_time[r] = reduce(
                        add,
                        dec_gap[j0 + 1 : jc + 1],
                        pre_acc[r] + (dec_sched[j0] - last_end[r]),
                    )
                    release(r)
                    num_dec -= 1
                    processed_sum -= pre[r] + dec[r]
            for r in entering:
                enter_decode(r)
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
            head, tail, num_dec, next_dec, prefilling, proc, t
        )
        entering, still = [], []
        if not entries and not batch_decodes:
            prefilling = skipped_sorted
            continue  # idle until the next arrival

        # ---- a run of decode-only batches that end without an event: in bulk ----
        carried = -1.0  # the time of the batch the run stopped at, when it drew it
        if batch_decodes and not entries and not prefilling:
            while completion_heap[0] not in completes_at:  # drop indices already done
                heappop(completion_heap)
            done_index = completion_heap[0]
            # an empty queue: the run stops at the batch an arrival lands in; a queue whose
            # head cannot be admitted stays so (same decodes, blocks only taken) until then
            next_arr = arr[tail] if head == tail and tail < n else math.inf
            while next_dec < done_index:
                # the decodes' mean KV size grows by one a batch: the prediction holds until
                # it crosses a multiple of the granularity
                mean = int((processed_sum + num_dec) / num_dec)
                rounded = (mean + g - 1) // g * g
                e0 = time_of(num_dec, num_dec, rounded, ())
                length = min(rounded - mean + 1, done_index - next_dec)
                if jitter is None:
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
                            out_size.extend(repeat(num_dec, k))
                            out_prefill.extend(repeat(0, k))
                            out_decode.extend(repeat(num_dec, k))
                            out_time.extend(map(operator.sub, ends[1 : k + 1], ends[:k]))
                        processed_sum += num_dec * k
                        next_dec += k
                        t = last_dec_end = ends[k]
                    if k < length:  # an arrival lands in the next batch
                        carried = e0
                        break
                    continue
                e = e0 * jitter()  # a draw per batch, as Vidur's predictor draws
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
                    out_size.append(num_dec)
                    out_prefill.append(0)
                    out_decode.append(num_dec)
                    out_time.append(t_end - t)
                processed_sum += num_dec
                next_dec += 1
                t = t_end
                if tracks:
                    sched.grow_decodes(next_dec, t, num_dec)
            batch_decodes = num_dec

        # ---- its shape, its time ----
        ones = batch_decodes
        ones_kv = processed_sum + batch_decodes if batch_decodes else 0  # vllm: not in prefills
        prefills: list[tuple[int, int]] = []
        chunk_tokens = 0
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
        if carried >= 0:
            e = carried
        else:
            e = time_of(total_q, ones, mean_kv, tuple(prefills))
            if jitter is not None:
                e = e * jitter()
        t_end = t + e
        busy = True

        # ---- schedule: first batch of a request, and the time it waited since its last ----
        for r, _ in entries:
            if not scheduled[r]:
                scheduled[r] = True
                sched_at[r] = t
            if last_end[r] == 0:
                pre_acc[r] = 0
            else:
                pre_acc[r] = pre_acc[r] + (t - last_end[r])
        if batch_decodes:
            batch_dec_index = next_dec
            next_dec += 1
            dec_exec.append(e)
            dec_sched.append(t)
            dec_gap.append(t - last_dec_end)
            last_dec_end = t_end
        batches += 1
        if record_steps:
            out_size.append(batch_decodes + len(entries))
            out_prefill.append(chunk_tokens)
            out_decode.append(batch_decodes)
            out_time.append(t_end - t)
        if len(dec_exec) > COMPACT_AT:  # drop the decode batches no running request was in
            oldest = min(
                (first_decode[r] for waiting in completes_at.values() for r in waiting),
                default=next_dec,
            )
            del dec_exec[: oldest - dec_base], dec_sched[: oldest - dec_base]
            del dec_gap[: oldest - dec_base]
            dec_base = oldest

    if head < n or num_dec or prefilling:
        pending = (n - head) + num_dec + len(prefilling)
        raise AssertionError(f"Simulation ended with {pending} pending requests")
    return _result(
        ids, arr, pre, dec, sched_at, prefill_done, done_at, exec_time, preempt_time,
        first_batch_id, batches, (out_size, out_prefill, out_decode, out_time),
    )  # fmt: skip


def _result(
    ids: list[int],
    arr: list[float],
    pre: list[int],
    dec: list[int],
    sched_at: list[float],
    prefill_done: list[float],
    done_at: list[float],
    exec_time: list[float],
    preempt_time: list[float],
    first_batch_id: int,
    batches: int,
    steps: tuple[array, array, array, array],
) -> LoopResult:
    """Vidur's expressions (MetricsStore._on_request_end) over the loop's records."""
    arrived = np.asarray(arr)
    done = np.asarray(done_at)
    first = np.asarray(prefill_done, dtype=float)
    decodes = np.asarray(dec, dtype=np.int64)
    inter = np.full(len(arr), math.nan)
    inter[1:] = arrived[1:] - arrived[:-1]
    # a request that ran in one batch never added a wait: Vidur keeps its int 0
    preempt: Any = np.asarray(preempt_time, dtype=float)
    if not any(isinstance(x, float) for x in preempt_time):
        preempt = preempt.astype(np.int64)
    frame = pd.DataFrame(
        {
            VIDUR_ID: np.asarray(ids, dtype=np.int64),
            "request_e2e_time": done - arrived,
            "request_execution_time": np.asarray(exec_time, dtype=float),
            "request_preemption_time": preempt,
            "request_scheduling_delay": np.asarray(sched_at) - arrived,
            "prefill_e2e_time": first - arrived,
            "decode_time_execution_plus_preemption_normalized": (done - first) / decodes,
            "request_num_prefill_tokens": np.asarray(pre, dtype=np.int64),
            "request_num_decode_tokens": decodes,
            "request_num_restarts": np.zeros(len(arr), dtype=np.int64),
            "request_inter_arrival_delay": inter,
        }
    )
    frame = frame.sort_values(VIDUR_ID, kind="stable").reset_index(drop=True)
    size, prefill, decode, elapsed = steps
    return LoopResult(
        requests=frame,
        num_batches=batches,
        batch_ids=np.arange(first_batch_id, first_batch_id + len(size), dtype=np.int64),
        batch_size=np.frombuffer(size, dtype=np.int64),
        batch_prefill_tokens=np.frombuffer(prefill, dtype=np.int64),
        batch_decode_tokens=np.frombuffer(decode, dtype=np.int64),
        batch_time_s=np.frombuffer(elapsed, dtype=np.float64),
    )
