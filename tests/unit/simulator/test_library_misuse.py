"""The simulator library refuses, naming the field or knob, what would otherwise give a silent
wrong answer or fail deep inside a run: a clock reused, a closed loop that never sends some of
its requests, knobs vLLM refuses, a router's settings it cannot read, a request added twice."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpu_simulate_test.calibration.serving_load import ServingLoad
from gpu_simulate_test.simulator.api import EngineSpec, FleetSpec, Workload, simulate
from gpu_simulate_test.simulator.engine import RequestBook, VllmV1Engine
from gpu_simulate_test.simulator.kv_cache import CountingKVCache
from gpu_simulate_test.simulator.step_model import BatchTimer, PredictorClock
from gpu_simulate_test.simulator.types import V1Params
from tests.unit.simulator.test_simulator_library import TokenClock

ENGINE = EngineSpec(V1Params(max_num_batched_tokens=64, max_num_seqs=4, block_size=16,
                             num_blocks=64))  # fmt: skip
SERVING = ServingLoad(
    rate_points=(1.0, 50.0), stretch_points=(1.1, 1.4), gap_points_ms=(0.1, 0.4),
    noise_sigma=0.2, noise_phi=0.5, noise_slow_share=0.5,
)  # fmt: skip


def _clock(seed: int = 0) -> PredictorClock:
    def base(shape: Any, _: int) -> Any:
        return SimpleNamespace(total_time=1e-3 + 1e-5 * sum(shape.num_q_tokens))

    return PredictorClock(BatchTimer(base, granularity=16), SERVING, seed=seed)


def _workload(n: int = 12) -> Workload:
    return Workload.of(np.arange(n) * 2e-3, np.full(n, 20), np.full(n, 6))


def test_a_ready_clock_times_one_run() -> None:
    w = _workload()
    first = simulate(w, _clock(), ENGINE).requests
    assert simulate(w, _clock(), ENGINE).requests.equals(first)  # a fresh clock: the same run
    used = _clock()
    simulate(w, used, ENGINE)
    with pytest.raises(ValueError, match=r"a clock times one engine's run.*step_model\.clock"):
        simulate(w, used, ENGINE)
    shared = _clock()
    with pytest.raises(ValueError, match=r"this clock has timed a run already"):
        simulate(w, [shared, shared], ENGINE, fleet=FleetSpec(2))


@pytest.mark.parametrize(
    ("arrivals", "after", "message"),
    [
        ([0.0, np.nan, np.nan], [(-1, 0.0), (2, 0.0), (1, 0.0)],
         r"after: requests \[1, 2\] follow each other in a cycle"),
        ([0.0, np.nan, 0.0], [(1, np.nan), (-1, 0.0), (-1, 0.0)],
         r"after\[0\] is \(1, nan\).*a finite think time >= 0"),
        ([0.0, np.nan, 0.0], [(1, np.inf), (-1, 0.0), (-1, 0.0)],
         r"after\[0\] is \(1, inf\).*a finite think time >= 0"),
    ],
)  # fmt: skip
def test_a_closed_loop_that_never_sends_a_request_is_refused(
    arrivals: list[float], after: list[tuple[int, float]], message: str
) -> None:
    w = Workload(np.array(arrivals), np.full(3, 10), np.full(3, 3), after=after)
    with pytest.raises(ValueError, match=message):
        simulate(w, TokenClock(), ENGINE)
    with pytest.raises(ValueError, match=message):
        simulate(w, [TokenClock(), TokenClock()], ENGINE, fleet=FleetSpec(2))


@pytest.mark.parametrize("bad", [np.nan, -0.5, np.inf])
def test_a_routing_time_that_is_not_a_time_is_named(bad: float) -> None:
    with pytest.raises(ValueError, match=rf"Workload.routed_at\[0\] is {bad}, expected a time"):
        Workload(np.array([0.0, 0.01]), np.full(2, 10), np.full(2, 5),
                 routed_at=np.array([bad, 0.0]))  # fmt: skip
    later = Workload(np.array([0.0, np.nan]), np.full(2, 10), np.full(2, 5),
                     after=[(1, 0.0), (-1, 0.0)], routed_at=np.array([0.0, bad]))  # fmt: skip
    assert np.isnan(later.arrival_s[1])  # a later turn is routed when it is sent


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"enable_prefix_caching": "no"}, r"V1Params.enable_prefix_caching is 'no', expected True"),
        ({"enable_chunked_prefill": 0}, r"V1Params.enable_chunked_prefill is 0, expected True"),
        ({"max_num_batched_tokens": 2}, r"max_num_batched_tokens \(2\) is below max_num_seqs"),
        ({"num_blocks": 1}, r"V1Params.num_blocks is 1, expected >= 2"),
    ],
)  # fmt: skip
def test_knobs_vllm_refuses_are_named(knobs: dict[str, Any], message: str) -> None:
    base: dict[str, Any] = {"max_num_batched_tokens": 64, "max_num_seqs": 4, "block_size": 16,
                            "num_blocks": 64}  # fmt: skip
    with pytest.raises(ValueError, match=message):
        V1Params(**{**base, **knobs})
    V1Params(**{**base, "enable_prefix_caching": np.bool_(True)})  # a numpy bool is a bool


def test_a_request_longer_than_an_unchunked_budget_is_refused_before_running() -> None:
    unchunked = EngineSpec(V1Params(32, 4, 16, 64, enable_chunked_prefill=False))
    w = Workload.of([0.0, 0.0], [20, 40], [2, 2])
    said = r"request 1 needs 42 tokens .* max_num_batched_tokens \(32\) with enable_chunked_prefill"
    with pytest.raises(ValueError, match=said):
        simulate(w, TokenClock(), unchunked)
    with pytest.raises(ValueError, match=said):
        simulate(w, [TokenClock(), TokenClock()], unchunked, fleet=FleetSpec(2))
    roomy = EngineSpec(V1Params(64, 4, 16, 64, enable_chunked_prefill=False))
    assert len(simulate(w, TokenClock(), roomy).requests) == 2


def test_an_engine_spec_without_knobs_or_a_name_is_refused() -> None:
    with pytest.raises(ValueError, match=r"EngineSpec.params is a dict, expected V1Params"):
        EngineSpec({"max_num_seqs": 4})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"EngineSpec.scheduler is None, expected an engine's"):
        EngineSpec(ENGINE.params, None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"poll_s": float("nan")}, r"fleet.poll_s is nan, expected a finite number of seconds"),
        ({"poll_s": -1.0}, r"fleet.poll_s is -1.0, expected a finite number of seconds >= 0"),
        ({"poll_s": "0.05"}, r"fleet.poll_s is '0.05'"),
        ({"router_seed": "x"}, r"fleet.router_seed is 'x', expected a whole number >= 0"),
        ({"router_seed": 1.5}, r"fleet.router_seed is 1.5, expected a whole number"),
        ({"router_seed": -1}, r"fleet.router_seed is -1, expected a whole number >= 0"),
        ({"router_seed": True}, r"fleet.router_seed is True"),
    ],
)  # fmt: skip
def test_router_settings_it_cannot_read_are_named(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FleetSpec(2, "prefix_affinity", **settings)
    FleetSpec(2, "prefix_affinity", poll_s=0, router_seed=3)


def test_one_clock_in_a_sequence_times_one_engine() -> None:
    w = _workload()
    alone = simulate(w, _clock(), ENGINE).requests
    assert simulate(w, [_clock()], ENGINE).requests.equals(alone)
    assert simulate(w, [_clock()], ENGINE, fleet=FleetSpec(1)).requests.equals(alone)
    with pytest.raises(ValueError, match=r"2 clocks for one engine.*fleet=FleetSpec\(2\)"):
        simulate(w, [_clock(), _clock()], ENGINE)


@pytest.mark.parametrize(
    ("prompt", "output", "message"),
    [
        ([10, 0], [5, 5], r"prompt_tokens\[1\] is 0, expected a whole number of tokens >= 1"),
        ([10, 10], [5, -2], r"Workload.output_tokens\[1\] is -2, expected a whole number"),
    ],
)  # fmt: skip
def test_a_request_without_tokens_is_named(
    prompt: list[int], output: list[int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Workload.of([0.0, 0.0], prompt, output)


def test_a_request_beyond_the_kv_cache_is_named() -> None:
    w = Workload.of([0.0, 0.0], [20, 2000], [5, 5])
    with pytest.raises(
        ValueError, match=r"request 1 needs more KV blocks than the cache has \(126"
    ):
        simulate(w, TokenClock(), ENGINE)


def test_the_inter_arrival_delay_is_from_the_previous_arrival_in_time() -> None:
    arrivals = np.array([0.0, 0.01, 0.03, 0.06])
    shuffled = np.array([2, 0, 3, 1])
    w = Workload.of(arrivals[shuffled], np.full(4, 20), np.full(4, 5))
    delay = simulate(w, TokenClock(), ENGINE).requests["request_inter_arrival_delay"]
    assert np.allclose(delay.to_numpy(), [0.02, np.nan, 0.03, 0.01], equal_nan=True)


def test_a_request_added_twice_is_named() -> None:
    params = ENGINE.params
    book = RequestBook([0.0, 0.0], [20, 20], [3, 3])
    engine = VllmV1Engine(params, book, CountingKVCache(params.usable_blocks, 16, 2), TokenClock())
    engine.add(0, 0.0)
    with pytest.raises(ValueError, match=r"add\(0, 0.0\): request 0 has reached an engine already"):
        engine.add(0, 0.0)
    engine.advance()
    assert not math.isnan(book.done[0])
    with pytest.raises(ValueError, match=r"add\(0, 1.0\): request 0 has reached an engine already"):
        engine.add(0, 1.0)  # finished: it would run again
    other = VllmV1Engine(params, book, CountingKVCache(params.usable_blocks, 16, 2), TokenClock())
    with pytest.raises(ValueError, match=r"request 0 has reached an engine already"):
        other.add(0, 1.0)  # a fleet's engines share the book
    other.add(1, 1.0)
