"""The runs of decode-only batches :class:`.aggregate_engine.AggregateEngine` takes in bulk: from
a batch that has only decodes and no prefill running, the batches up to the next completion or
the one a stop time (an arrival, the caller's horizon) lands in, without per-batch events."""

from __future__ import annotations

import operator
from array import array
from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate, repeat

from gpu_simulate_test.vidur_simulate.batch_forming import KvBlocks
from gpu_simulate_test.vidur_simulate.loop_setup import KvCacheExhausted


class DecodeRuns:
    """The bulk runs, over the engine state they read and write (these slots, set by the
    engine)."""

    __slots__ = (
        "batches",
        "blocks_due",
        "dec_exec",
        "dec_gap",
        "dec_sched",
        "g",
        "jitter",
        "last_dec_end",
        "next_dec",
        "num_blocks",
        "num_dec",
        "out_decode",
        "out_prefill",
        "out_size",
        "out_time",
        "processed_sum",
        "record_steps",
        "sched",
        "time_of",
        "tracks",
    )

    num_dec: int
    processed_sum: int
    next_dec: int
    g: int
    time_of: Callable[[int, int, int, tuple[tuple[int, int], ...]], float]
    jitter: Callable[[], float] | None
    sched: KvBlocks
    blocks_due: dict[int, int]
    tracks: bool
    num_blocks: int
    record_steps: bool
    dec_exec: array[float]
    dec_sched: array[float]
    dec_gap: array[float]
    last_dec_end: float
    batches: int
    out_size: array[int]
    out_prefill: array[int]
    out_decode: array[int]
    out_time: array[float]

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
