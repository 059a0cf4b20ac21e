"""The simulator as a library: a toy scheduler registered by one line and run through
``simulate``; engines a caller steps side by side on one clock, sharing one request book, take
the same steps as each engine run alone on its share; the step model times alike at any level."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from gpu_simulate_test.core.engines.step_record import SCHEDULE_COLUMNS
from gpu_simulate_test.simulator.api import EngineSpec, Workload, latency_table, simulate
from gpu_simulate_test.simulator.engine import RequestBook, VllmV1Engine
from gpu_simulate_test.simulator.kv_cache import CountingKVCache
from gpu_simulate_test.simulator.registry import ENGINES
from gpu_simulate_test.simulator.request_rows import v1_rows
from gpu_simulate_test.simulator.run import V1Result, run_v1, schedule_frame
from gpu_simulate_test.simulator.types import Composition, StepClock, V1Params

PARAMS = V1Params(max_num_batched_tokens=64, max_num_seqs=4, block_size=16, num_blocks=64)


class TokenClock:
    """A step lasts 1 ms plus 0.1 ms per token; steps back to back."""

    def gap(self, index: int) -> float:
        return 0.0

    def lead(self, index: int) -> float:
        return 0.0

    def body(self, index: int, step: Composition) -> float:
        return 1e-3 + 1e-4 * (step.prefill_tokens + step.decode_tokens)


def one_at_a_time(
    params: V1Params,
    clock: StepClock,
    arrived_at: np.ndarray,
    prefill_tokens: np.ndarray,
    decode_tokens: np.ndarray,
    *,
    segments: Any = None,
    after: Any = None,
    log_steps: bool = True,
) -> V1Result:
    """A toy scheduler: each request alone, its prompt in one step, then one decode a step."""
    n = len(arrived_at)
    first, done, busy = [math.nan] * n, [math.nan] * n, [0.0] * n
    ready, index = 0.0, 0
    for r in np.argsort(arrived_at, kind="stable"):
        start = max(ready, float(arrived_at[r]))
        scheduled = start
        p, o = int(prefill_tokens[r]), int(decode_tokens[r])
        for k in range(o):
            q = p if k == 0 else 1
            step = Composition(int(k == 0), q * (k == 0), int(k > 0), q * (k > 0), ((q, p + k),))
            start += clock.body(index, step)
            index += 1
            first[r] = start if k == 0 else first[r]
        done[r], busy[r], ready = start, start - scheduled, start
    rows = v1_rows(
        list(map(float, arrived_at)), [int(x) for x in prefill_tokens],
        [int(x) for x in decode_tokens], [float(a) for a in arrived_at], first, done, busy,
        [0] * n,
    )  # fmt: skip
    return V1Result(rows, schedule_frame([]), 0)


def workload(n: int = 30, seed: int = 0) -> Workload:
    rng = np.random.default_rng(seed)
    return Workload.of(
        np.cumsum(rng.exponential(0.004, n)), rng.integers(8, 80, n), rng.integers(2, 20, n)
    )


def test_a_toy_scheduler_is_one_registry_line_and_runs() -> None:
    engines = ENGINES.with_engine("one_at_a_time", one_at_a_time)
    assert engines.names() == ("one_at_a_time", "vllm_v1") and ENGINES.names() == ("vllm_v1",)
    w = workload()
    toy = simulate(w, TokenClock(), EngineSpec(PARAMS, "one_at_a_time"), engines=engines)
    v1 = simulate(w, TokenClock(), EngineSpec(PARAMS))
    toy_e2e = latency_table(toy)["e2e_ms"].to_numpy()
    v1_e2e = latency_table(v1)["e2e_ms"].to_numpy()
    assert np.all(np.isfinite(toy_e2e)) and len(toy_e2e) == len(w.arrival_s)
    # one at a time queues what vLLM batches: slower on average under this load
    assert toy_e2e.mean() > v1_e2e.mean()
    with pytest.raises(ValueError, match=r"one_at_a_time, vllm_v1"):
        simulate(w, TokenClock(), EngineSpec(PARAMS, "fcfs"), engines=engines)
    with pytest.raises(TypeError):
        ENGINES.runners["x"] = one_at_a_time  # type: ignore[index]


def _alone(w: Workload, ids: Sequence[int]) -> V1Result:
    idx = np.asarray(ids)
    return run_v1(
        PARAMS, TokenClock(), w.arrival_s[idx], w.prompt_tokens[idx], w.output_tokens[idx]
    )


def test_engines_stepped_side_by_side_take_each_engines_own_steps() -> None:
    """Two engines on one clock, a caller routing every other request to each (round robin) and
    always stepping the one that is due first: each takes exactly the steps it takes alone on
    its share, and the shared book holds every request's times."""
    w = workload(40, seed=1)
    n = len(w.arrival_s)
    book = RequestBook(w.arrival_s.tolist(), w.prompt_tokens.tolist(), w.output_tokens.tolist())
    engines = [
        VllmV1Engine(PARAMS, book, CountingKVCache(PARAMS.usable_blocks, PARAMS.block_size, n),
                     TokenClock())
        for _ in range(2)
    ]  # fmt: skip
    arrivals = sorted(range(n), key=lambda r: (w.arrival_s[r], r))
    routed = 0
    while True:
        due = min(engines, key=lambda e: e.next_start())
        if routed < n and w.arrival_s[arrivals[routed]] <= due.next_start():
            r = arrivals[routed]
            engines[routed % 2].add(r, float(w.arrival_s[r]))
            routed += 1
        elif due.next_start() < math.inf:
            due.step()
        else:
            break
    assert sum(e.finished for e in engines) == n
    for k, engine in enumerate(engines):
        share = arrivals[k::2]
        alone = _alone(w, share)
        mine = schedule_frame(engine.rows)
        assert list(mine.columns) == list(SCHEDULE_COLUMNS)
        # every column but the requests' ids (the book's, against the share's own)
        same = list(SCHEDULE_COLUMNS)[:-1]
        assert mine[same].equals(alone.schedule[same])
        done = np.asarray(book.done)[share]
        assert done == pytest.approx(
            alone.requests["request_e2e_time"].to_numpy() + w.arrival_s[share]
        )


def test_an_engine_stepped_with_nothing_to_do_or_a_request_not_in_its_book_says_so() -> None:
    w = workload(3)
    book = RequestBook(w.arrival_s.tolist(), w.prompt_tokens.tolist(), w.output_tokens.tolist())
    engine = VllmV1Engine(PARAMS, book, CountingKVCache(PARAMS.usable_blocks, PARAMS.block_size, 3),
                          TokenClock())  # fmt: skip
    with pytest.raises(ValueError, match="nothing to step: no request is waiting, running or"):
        engine.step()
    for r, at in ((3, 0.0), (-1, 0.0), (0, math.nan)):
        with pytest.raises(ValueError, match=rf"add\({r}, {at}\): expected a request of the book"):
            engine.add(r, at)
    late = float(w.arrival_s[1])
    with pytest.raises(ValueError, match=rf"add\(1, {late - 0.5}\): request 1 arrives at"):
        engine.add(1, late - 0.5)  # before its own arrival: a negative wait
    engine.add(0, float(w.arrival_s[0]))
    while engine.next_start() < math.inf:
        engine.step()
    assert engine.finished == 1
    with pytest.raises(ValueError, match="nothing to step"):  # done: nothing left
        engine.step()


class PausingClock(TokenClock):
    """:class:`TokenClock` with a 0.3 ms pause between busy steps (vLLM's loop after the
    outputs: the engine core takes its input in at the pause's end, right before it schedules)."""

    def gap(self, index: int) -> float:
        return 3e-4


def test_a_request_sent_during_a_step_is_queued_as_the_next_step_is_scheduled() -> None:
    """vLLM's core stamps a request queued in ``_process_input_queue``, right before it schedules
    (on make run's truth 0.01–0.08 ms before the next start, 0.12–0.37 ms after the step's end):
    a request that came during a step is queued at the next step's scheduling, not the step's
    end, so the pause behind the outputs is not on the engine's clock."""
    prompt, out = [32, 8, 8], [4, 2, 2]
    book = RequestBook([0.0, 1e-3, 10.0], prompt, out)
    kv = CountingKVCache(PARAMS.usable_blocks, PARAMS.block_size, 3)
    engine = VllmV1Engine(PARAMS, book, kv, PausingClock())
    for r in range(3):
        engine.add(r, book.arr[r])
    while engine.next_start() < math.inf:
        engine.step()
    steps = schedule_frame(engine.rows)
    first_end = steps["end_time_s"].iloc[0]
    assert book.arr[1] < first_end  # request 1 came while the first step ran
    second_start = steps["start_time_s"].iloc[1]
    assert second_start == pytest.approx(first_end + 3e-4)
    assert book.queued_at[1] == pytest.approx(second_start)  # not first_end
    assert book.queued_at[0] == 0.0 and book.queued_at[2] == 10.0  # an idle engine: on arrival
    assert book.scheduled_at[1] == pytest.approx(second_start)
