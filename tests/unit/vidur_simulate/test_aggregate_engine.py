"""Our aggregate loop as an engine a caller steps (:class:`.aggregate_engine.AggregateEngine`):
two engines stepped side by side on one clock, each advanced only up to the next event, take
exactly the batches each takes alone on its share (:func:`.event_loop.run_loop`), and so does
one engine taking its batches one :meth:`~.AggregateEngine.step` at a time. The batches' times
come from a toy predictor (no Vidur), with and without the per-batch jitter draw."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.calibration.overhead import StepOverhead
from gpu_simulate_test.simulator.request_rows import VIDUR_ID
from gpu_simulate_test.vidur_simulate.aggregate_engine import AggregateEngine
from gpu_simulate_test.vidur_simulate.event_loop import LoopResult, run_loop
from gpu_simulate_test.vidur_simulate.loop_setup import BatchTimer, LoopParams

SCHEDULERS = {
    "sarathi": LoopParams("sarathi", 400, 16, 4, 8, 8, chunk_size=64),
    "vllm": LoopParams("vllm", 400, 16, 4, 8, 8, max_tokens_in_batch=256),
    "orca": LoopParams("orca", 400, 16, 0, 8, 6, max_blocks_per_sequence=20),
}
OVERHEAD = StepOverhead("toy", 0.1, 0.01, 0.02, 0.001, 0.05, (1, 8), (0.1, 0.3))


def toy_ops(shape: Any, stage: int) -> Any:
    """Profiled ops of a batch: 1 ms, plus per query token and per KV token."""
    kv = sum(shape.num_kv_tokens)
    return SimpleNamespace(total_time=1e-3 + 2e-5 * shape._total_num_q_tokens + 1e-7 * kv)


def timer(jitter: bool) -> BatchTimer:
    """A fresh timer (its own memo and, with ``jitter``, its own seeded draws)."""
    if not jitter:
        return BatchTimer(toy_ops, 16)
    rng = random.Random(7)
    draw: Callable[[], float] = lambda: rng.uniform(0.9, 1.1)  # noqa: E731
    return BatchTimer(toy_ops, 16, OVERHEAD, draw)


def workload(n: int, seed: int) -> tuple[list[float], list[int], list[int]]:
    """Poisson arrivals (some at one instant), prompts and decodes."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(0.004, n))
    times[::5] = times[::5].round(2)
    arr = sorted(float(x) for x in times)
    return arr, rng.integers(1, 150, n).tolist(), rng.integers(1, 70, n).tolist()


def batches(result: LoopResult | AggregateEngine) -> list[list[Any]]:
    if isinstance(result, AggregateEngine):
        return [list(result.out_size), list(result.out_prefill), list(result.out_decode),
                list(result.out_time)]  # fmt: skip
    columns = [result.batch_size, result.batch_prefill_tokens, result.batch_decode_tokens]
    return [x.tolist() for x in [*columns, result.batch_time_s]]


def same_rows(mine: pd.DataFrame, share: Sequence[int], alone: pd.DataFrame) -> None:
    """The engine's rows of ``share`` (by request id) are the alone run's (by share position)."""
    mine = mine.set_index(VIDUR_ID).loc[list(share)].reset_index(drop=True)
    pd.testing.assert_frame_equal(mine, alone.drop(columns=VIDUR_ID), check_exact=True)


@pytest.mark.parametrize("jitter", [False, True])
@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_engines_stepped_side_by_side_take_each_engines_own_batches(
    scheduler: str, jitter: bool
) -> None:
    """A caller routing every other request to each of two engines (round robin), always
    advancing the one due first only up to the next event (an arrival, the other engine's
    next batch): each engine's batches and request rows are its alone run's, to the bit."""
    params = SCHEDULERS[scheduler]
    arr, pre, dec = workload(80, seed=3)
    n = len(arr)
    engines = [AggregateEngine(params, timer(jitter), pre, dec) for _ in range(2)]
    routed = 0
    while True:
        due, other = sorted(engines, key=lambda e: e.next_start())
        start = due.next_start()
        arrival = arr[routed] if routed < n else math.inf
        if routed < n and arrival <= start:
            engines[routed % 2].add(routed, arrival)
            routed += 1
        elif start < math.inf:
            until = min(arrival, other.next_start())
            if until > start:
                due.advance(until)
            else:
                due.step()
        else:
            break
    assert sum(e.finished for e in engines) == n
    assert all(e.num_waiting == e.num_running == 0 and e.kv_usage() == 0 for e in engines)
    for k, engine in enumerate(engines):
        share = list(range(k, n, 2))
        alone = run_loop(
            params, timer(jitter), np.asarray(arr)[share], np.asarray(pre)[share],
            np.asarray(dec)[share],
        )  # fmt: skip
        assert alone.num_batches == engine.batches
        assert batches(engine) == batches(alone)
        same_rows(engine.requests(), share, alone.requests)


@pytest.mark.parametrize("jitter", [False, True])
@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_one_batch_a_step_is_the_loop(scheduler: str, jitter: bool) -> None:
    """Every arrival added up front, then :meth:`~.AggregateEngine.step` until nothing is left
    (no run of decodes in bulk): the loop's batches and rows; the router's view on the way."""
    params = SCHEDULERS[scheduler]
    arr, pre, dec = workload(60, seed=4)
    engine = AggregateEngine(params, timer(jitter), pre, dec)
    for r, at in enumerate(arr):
        engine.add(r, at)
    seen_busy = False
    while engine.next_start() < math.inf:
        before = engine.next_start()
        engine.step()
        assert engine.next_start() >= before
        assert 0 <= engine.kv_usage() <= 1
        seen_busy |= engine.num_running > 1 and engine.num_waiting > 0
    assert seen_busy
    assert engine.unfinished() == 0
    alone = run_loop(params, timer(jitter), np.asarray(arr), np.asarray(pre), np.asarray(dec))
    assert batches(engine) == batches(alone)
    same_rows(engine.requests(), range(len(arr)), alone.requests)


def test_arrivals_out_of_order_are_refused() -> None:
    engine = AggregateEngine(SCHEDULERS["sarathi"], timer(False), [10, 10], [5, 5])
    engine.add(0, 1.0)
    with pytest.raises(ValueError, match="before the last one added"):
        engine.add(1, 0.5)


@pytest.mark.parametrize("jitter", [False, True])
@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_the_loop_shows_its_progress_and_takes_the_same_batches(
    scheduler: str, jitter: bool
) -> None:
    """With a progress callback (the stage's bar: a million requests took minutes with nothing
    shown), the arrivals go in slices and the engine advances up to each next one: every
    request is counted once, and the batches and rows are the loop's without it, to the bit."""
    params = SCHEDULERS[scheduler]
    arr, pre, dec = workload(450, seed=5)  # more requests than slices, ties among them
    args = (np.asarray(arr), np.asarray(pre), np.asarray(dec))
    counted: list[int] = []
    shown = run_loop(params, timer(jitter), *args, progress=counted.append)
    alone = run_loop(params, timer(jitter), *args)
    assert sum(counted) == len(arr) and len(counted) > 2
    assert batches(shown) == batches(alone)
    same_rows(shown.requests, range(len(arr)), alone.requests)
