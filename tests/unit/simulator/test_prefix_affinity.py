"""The ``prefix_affinity`` router (llm-d's scoring: prefix hits, queue depth, KV usage): a
conversation's turns follow their shared prefix to one engine, so the fleet's prefix cache hits
more than behind round robin; its scores are the documented ones; with nothing cached it
balances by queue and KV usage."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from gpu_simulate_test.simulator.fleet import run_fleet
from gpu_simulate_test.simulator.routers import ROUTERS
from gpu_simulate_test.simulator.routers.prefix_affinity import PrefixAffinity
from gpu_simulate_test.simulator.types import ENGINE
from tests.unit.simulator.test_simulator_library import PARAMS, TokenClock

CACHED = replace(PARAMS, enable_prefix_caching=True, num_blocks=256, max_num_batched_tokens=256)


def grouped(n: int, groups: int, seed: int = 0) -> tuple[tuple[np.ndarray, ...], list[Any]]:
    """``n`` requests, each a group's 96-token system prompt and its own 8..40 tokens."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.01, n))
    group = rng.integers(groups, size=n)
    own = rng.integers(8, 40, n)
    segments = [[(("sys", int(g)), 96), (("own", r), int(o))] for r, (g, o) in
                enumerate(zip(group, own, strict=True))]  # fmt: skip
    return (arrivals, 96 + own, rng.integers(2, 12, n)), segments


def hit_share(router: str, engines: int = 2) -> tuple[float, Any]:
    w, segments = grouped(80, groups=16)
    clocks = [TokenClock() for _ in range(engines)]
    fleet = run_fleet(CACHED, clocks, ROUTERS[router](engines, 1), *w, segments=segments)
    assert fleet.prefix_cache is not None
    queries = sum(s["queries"] for s in fleet.prefix_cache)
    return sum(s["hits"] for s in fleet.prefix_cache) / queries, fleet


def test_shared_prefixes_follow_their_engine_and_hit_more_than_round_robin() -> None:
    affinity, fleet = hit_share("prefix_affinity")
    spread, _ = hit_share("round_robin")
    assert affinity > spread + 0.08, (affinity, spread)
    engines = fleet.requests[ENGINE].to_numpy()
    assert set(engines.tolist()) == {0, 1}  # both engines used
    _, segments = grouped(80, groups=16)
    group = np.array([s[0][0][1] for s in segments])
    # a group's requests on its first request's engine (round robin: about half)
    same = [engines[group == g][1:] == engines[group == g][0] for g in set(group.tolist())]
    assert np.concatenate(same).mean() > 0.9


def test_scores_are_llm_ds() -> None:
    router = PrefixAffinity(2, seed=0)
    router._remember(0, [1, 2, 3, 4], capacity=10)
    assert router.prefix_scores([1, 2, 9, 4]) == [0.5, 0.0]  # matched from the start only
    assert router.prefix_scores([]) == [0.0, 0.0]
    router._remember(1, [5, 6, 7], capacity=2)  # least recently used dropped
    assert list(router.index[1]) == [6, 7]


class Engine:
    def __init__(self, waiting: int, running: int, usage: float) -> None:
        self.params, self.num_waiting, self.num_running = CACHED, waiting, running
        self.usage = usage

    def kv_usage(self) -> float:
        return self.usage


class Published:
    """Engines with fixed counts, nothing cached."""

    def __init__(self, counts: list[tuple[int, int, float]]) -> None:
        self.counts = counts
        self.engines = [Engine(*c) for c in counts]

    def published(self, engine: int, at: float) -> tuple[int, int, float]:
        return self.counts[engine]

    def prompt_blocks(self, r: int) -> list[int]:
        return []


@pytest.mark.parametrize(
    ("counts", "chosen"),
    [
        ([(4, 2, 0.2), (0, 2, 0.2), (2, 2, 0.2)], 1),  # the shortest queue
        ([(1, 2, 0.9), (1, 2, 0.1), (1, 2, 0.5)], 1),  # queues equal: the emptiest cache
        ([(0, 2, 0.9), (1, 2, 0.0)], 0),  # queue 2 x 1 + kv 2 x 0.1 = 2.2 > 0 + 2 x 1.0
    ],
)
def test_without_hits_queue_and_kv_usage_decide(
    counts: list[tuple[int, int, float]], chosen: int
) -> None:
    router = PrefixAffinity(len(counts), seed=0)
    assert router.route(0, 0.0, Published(counts)) == chosen  # type: ignore[arg-type]
