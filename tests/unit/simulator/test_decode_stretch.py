"""Decode stretches (:meth:`VllmV1Engine.advance`): steps where every running request decodes
one token and nothing can change that are taken in one pass; the result is the one :meth:`step`
gives step by step, bit for bit, with either KV cache, preemptions and closed loops, and the
step model's ``decode_body`` is its ``body`` of the same step."""

from __future__ import annotations

import math
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpu_simulate_test.calibration import serving_load
from gpu_simulate_test.calibration.serving_load import ServingLoad
from gpu_simulate_test.simulator.engine import RequestBook, Stretch, VllmV1Engine
from gpu_simulate_test.simulator.kv_cache import CountingKVCache
from gpu_simulate_test.simulator.run import run_v1, schedule_frame
from gpu_simulate_test.simulator.step_model import BatchTimer, PredictorClock
from gpu_simulate_test.simulator.types import Composition, V1Params


class DrawClock:
    """Seeded gaps and a body that reads the whole composition (KV sizes included)."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def gap(self, index: int) -> float:
        return float(self.rng.choice([0.0, 2e-4, 1e-3]))

    def lead(self, index: int) -> float:
        return 0.0

    def body(self, index: int, step: Composition) -> float:
        kv = sum(size for _, size in step.chunks)
        return 1e-3 + 1e-5 * step.prefill_tokens + 3e-5 * step.decode_tokens + 1e-8 * kv


class StretchingDrawClock(DrawClock):
    def decode_body(self, index: int, start_s: float, requests: int, kv_tokens: int) -> float:
        return 1e-3 + 1e-5 * 0 + 3e-5 * requests + 1e-8 * kv_tokens


def _case(seed: int, caching: bool, closed: bool) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    n = 60
    prompts = rng.integers(4, 60, n)
    outs = rng.integers(2, 40, n)
    arrivals = np.cumsum(rng.exponential(0.01, n))
    after = None
    if closed:  # every other request follows the one before it
        after = [(r + 1, 0.005) if r % 2 == 0 else (-1, 0.0) for r in range(n)]
        arrivals[1::2] = np.nan
    segments = [[(("P", r % 3), 8), (("U", r), int(p) - 8)] for r, p in enumerate(prompts)]
    params = V1Params(
        max_num_batched_tokens=48,
        max_num_seqs=8,
        block_size=8,
        num_blocks=int(rng.choice([24, 200])),  # a tight cache preempts
        enable_prefix_caching=caching,
    )
    return {
        "params": params,
        "arrived_at": arrivals,
        "prefill_tokens": prompts,
        "decode_tokens": outs,
        "segments": segments if caching else None,
        "after": after,
    }


@pytest.mark.parametrize("caching", [False, True])
@pytest.mark.parametrize("closed", [False, True])
def test_a_stretch_gives_the_steps_one_by_one(caching: bool, closed: bool) -> None:
    for seed in range(6):
        case = _case(seed, caching, closed)
        one_by_one = run_v1(clock=DrawClock(seed), **case)
        stretched = run_v1(clock=StretchingDrawClock(seed), **case)
        assert stretched.requests.equals(one_by_one.requests)
        assert stretched.schedule.equals(one_by_one.schedule)
        assert stretched.preemptions == one_by_one.preemptions
        assert stretched.prefix_cache == one_by_one.prefix_cache


@pytest.mark.parametrize("clock", [DrawClock, StretchingDrawClock])
def test_a_step_counts_its_running_requests_before_any_finishes(clock: type[DrawClock]) -> None:
    # as vLLM's step record does (``len(scheduler.running)`` after scheduling): a request
    # emitting its last token in a step is still running in that step's row, so a busy step
    # after it is not taken for an idle engine waking (``step_features``, the oracle replay)
    case = _case(0, caching=False, closed=False)
    schedule = run_v1(clock=clock(0), **case).schedule
    scheduled = np.array([len(text.split()) for text in schedule["requests"]])
    assert (schedule["num_running"] >= scheduled).all()
    woke = ~serving_load.step_features(schedule)["busy"].to_numpy()
    # the truth: a step wakes the engine where every request queued by the previous step's end
    # had finished by then (each request's queue time and end from the requests' table)
    requests = run_v1(clock=clock(0), **case).requests
    queued = requests["engine_queued_time"].to_numpy()
    done = case["arrived_at"] + requests["request_e2e_time"].to_numpy()  # e2e from arrival
    prev_end = np.concatenate([[-np.inf], schedule["end_time_s"].to_numpy()[:-1]])
    idle = np.array([not ((queued <= e) & (done > e + 1e-12)).any() for e in prev_end])
    assert idle.sum() >= 2 and (~idle).sum() > 100
    np.testing.assert_array_equal(woke, idle)


def test_stretches_are_taken_and_stop_where_an_arrival_is_due() -> None:
    """Two long decodes, a third request arriving mid-way: the stretch ends at the step that
    queues it, and the steps after its prefill stretch again."""
    params = V1Params(max_num_batched_tokens=64, max_num_seqs=4, block_size=16, num_blocks=64)
    book = RequestBook([0.0, 0.0, 0.0505], [10, 10, 10], [40, 40, 20])
    engine = VllmV1Engine(params, book, CountingKVCache(63, 16, 3), StretchingDrawClock(0))
    for r in range(3):
        engine.add(r, book.arr[r])
    engine.advance()
    stretches = [row for row in engine.rows if isinstance(row, Stretch)]
    assert len(stretches) >= 2
    schedule = schedule_frame(engine.rows)
    assert len(schedule) == engine.index
    assert (np.diff(schedule["step_index"]) == 1).all()
    queued = book.queued_at[2]
    step = schedule[schedule["start_time_s"] >= queued].iloc[0]
    assert step["num_prefill_requests"] == 1  # the arrival's prefill, not inside a stretch
    assert engine.finished == 3


def test_advance_stops_before_until() -> None:
    params = V1Params(max_num_batched_tokens=64, max_num_seqs=4, block_size=16, num_blocks=64)
    book = RequestBook([0.0], [10], [200])
    engine = VllmV1Engine(params, book, CountingKVCache(63, 16, 1), StretchingDrawClock(1))
    engine.add(0, 0.0)
    engine.advance(until=0.05)
    assert engine.next_start() >= 0.05
    ends = schedule_frame(engine.rows)["start_time_s"]
    assert ends.max() < 0.05
    assert math.isnan(book.done[0])


def _timer() -> BatchTimer:
    def base(shape: Any, _: int) -> Any:
        q, kv = shape.num_q_tokens, shape.num_kv_tokens
        return SimpleNamespace(total_time=1e-3 + 1e-5 * sum(q) + 1e-8 * sum(kv))

    return BatchTimer(base, granularity=16)


@pytest.mark.parametrize("serving", [None, ServingLoad(
    rate_points=(1.0, 50.0), stretch_points=(1.1, 1.4), gap_points_ms=(0.1, 0.4),
    noise_sigma=0.2, noise_phi=0.5, noise_slow_share=0.5,
)])  # fmt: skip
def test_the_step_models_decode_body_is_its_body(serving: ServingLoad | None) -> None:
    """The same value and the same draws, step after step (jitter and serving terms on)."""

    def jitter(rng: np.random.Generator) -> Callable[[], float]:
        return lambda: float(rng.lognormal(0.0, 0.1))

    clocks = [
        PredictorClock(
            _timer(), serving, seed=5, scale=1.3, jitter=jitter(np.random.default_rng(3))
        )
        for _ in range(2)
    ]
    start = 0.0
    for index in range(200):
        n = 1 + index % 5
        contexts = [30 + 7 * k + index for k in range(n)]
        step = Composition(0, 0, n, n, tuple((1, c) for c in contexts), start_s=start)
        full = clocks[0].body(index, step)
        fast = clocks[1].decode_body(index, start, n, sum(contexts))
        assert fast == full
        assert clocks[0].gap(index + 1) == clocks[1].gap(index + 1)
        start += full + 1e-4
