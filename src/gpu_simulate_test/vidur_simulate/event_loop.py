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

The loop is an engine a caller can step (:class:`.aggregate_engine.AggregateEngine`, beside
vLLM V1's :class:`~gpu_simulate_test.simulator.engine.VllmV1Engine`): :func:`run_loop` adds every
arrival to one and advances it to the end.

What it does not: KV-cache preemption (a request restarted for lack of blocks; Vidur 0.0.26
then fails its own assertion), more than one replica or stage.
:func:`.loop_setup.unsupported_reason` says when the loop applies, and the loop raises
:class:`.loop_setup.KvCacheExhausted` the moment a decode batch could run out of blocks, so the
caller runs Vidur's own loop instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpu_simulate_test.vidur_simulate.aggregate_engine import COMPACT_AT, AggregateEngine
from gpu_simulate_test.vidur_simulate.loop_setup import BatchTimer, LoopParams

__all__ = ["COMPACT_AT", "PROGRESS_SLICES", "LoopResult", "run_loop"]

PROGRESS_SLICES = 200
"""With a progress callback, :func:`run_loop` adds the arrivals in this many slices."""


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
    progress: Callable[[int], None] | None = None,
) -> LoopResult:
    """Simulate requests (row ``i`` is Vidur's request id ``i``) on one replica: one engine
    given every arrival (in time order, ties by id) and advanced to the end; with
    ``record_steps`` false, batches are counted but their shapes not kept. With ``progress``,
    the arrivals are added in :data:`PROGRESS_SLICES` slices, the engine advanced up to each
    next one (the same batches, to the bit: an engine is stepped so), and ``progress(k)`` told
    the ``k`` requests finished meanwhile."""
    arrived = np.asarray(arrived_at, dtype=float)
    order = np.argsort(arrived, kind="stable").tolist()
    arr: list[float] = [float(x) for x in arrived]
    pre: list[int] = [int(x) for x in np.asarray(prefill_tokens)]
    dec: list[int] = [int(x) for x in np.asarray(decode_tokens)]
    engine = AggregateEngine(params, timer, pre, dec, record_steps, compact_at=COMPACT_AT)
    add = engine.add
    if progress is None:
        for r in order:
            add(r, arr[r])
    else:
        size = max(1, -(-len(order) // PROGRESS_SLICES))
        for start in range(0, len(order), size):
            for r in order[start : start + size]:
                add(r, arr[r])
            if start + size < len(order):  # every batch before the next arrival not added
                before = engine.finished
                engine.advance(arr[order[start + size]])
                progress(engine.finished - before)
    before = engine.finished
    engine.advance()
    if progress is not None:
        progress(engine.finished - before)
    pending = engine.unfinished()
    if pending:
        raise AssertionError(f"Simulation ended with {pending} pending requests")
    return LoopResult(
        requests=engine.requests(),
        num_batches=engine.batches,
        batch_ids=np.arange(first_batch_id, first_batch_id + len(engine.out_size), dtype=np.int64),
        batch_size=np.frombuffer(engine.out_size, dtype=np.int64),
        batch_prefill_tokens=np.frombuffer(engine.out_prefill, dtype=np.int64),
        batch_decode_tokens=np.frombuffer(engine.out_decode, dtype=np.int64),
        batch_time_s=np.frombuffer(engine.out_time, dtype=np.float64),
    )
