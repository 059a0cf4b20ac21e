"""Prefix affinity, one code for the real client and the simulated fleet: the prompt's chained
block keys, the same decisions from the same scraped load on both sides, and the simulated
scrape's staleness (what the engines published by the last tick)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from gpu_simulate_test.core.engines.server_load import Scraped, ServerLoads
from gpu_simulate_test.core.prefix_affinity import chained_blocks
from gpu_simulate_test.core.routing import CLIENT_ROUTERS
from gpu_simulate_test.simulator.routers import ROUTERS


def test_chained_keys_are_equal_exactly_where_every_token_before_is() -> None:
    a = chained_blocks(list(range(10)), 4)
    assert len(a) == 2  # the partial last block has no key
    b = chained_blocks([*range(8), 99, 98], 4)
    assert b == a  # they differ only in the partial block
    c = chained_blocks([0, 1, 2, 7, 4, 5, 6, 7], 4)
    assert c[0] != a[0] and c[1] != a[1]  # a change in block 0 changes every key after it
    d = chained_blocks([0, 1, 2, 3, 9, 5, 6, 7], 4)
    assert d[0] == a[0] and d[1] != a[1]
    assert chained_blocks([1, 2], 4) == []


class _Fleet:
    """A simulated fleet's view: engines whose (waiting, running, usage) change at set times."""

    def __init__(self, changes: list[list[tuple[float, tuple[int, int, float]]]], blocks) -> None:
        self.changes, self.blocks = changes, blocks
        params = SimpleNamespace(num_blocks=64)
        self.engines = [SimpleNamespace(params=params) for _ in changes]

    def published(self, engine: int, at: float) -> tuple[int, int, float]:
        seen = [c for t, c in self.changes[engine] if t <= at]
        return seen[-1] if seen else (0, 0, 0.0)

    def prompt_blocks(self, r: int) -> list[int]:
        return self.blocks[r]


def test_the_client_and_the_simulated_fleet_decide_alike_on_the_same_scrapes() -> None:
    rng = np.random.default_rng(3)
    engines, n, poll_s = 3, 300, 0.05
    prefixes = [list(rng.integers(0, 1000, 64)) for _ in range(6)]
    prompts = [
        prefixes[int(rng.integers(6))][: int(rng.integers(16, 65))]
        + list(rng.integers(0, 1000, int(rng.integers(0, 40))))
        for _ in range(n)
    ]
    blocks = [chained_blocks(p, 16) for p in prompts]
    times = np.cumsum(rng.exponential(0.02, n))
    changes = [
        [(float(t), (int(rng.random() < 0.2), 1, float(rng.uniform(0, 0.2)))) for t in
         np.sort(rng.uniform(0, times[-1], 40))]
        for _ in range(engines)
    ]  # fmt: skip
    fleet = _Fleet(changes, blocks)
    client, simulated = (
        CLIENT_ROUTERS["prefix_affinity"](engines, 7),
        ROUTERS["prefix_affinity"](engines, 7, poll_s),
    )
    loads = ServerLoads(["-"] * engines, poll_s, 64)
    picks = []
    for r, now in enumerate(times):
        tick = np.floor(now / poll_s) * poll_s  # what the client's last scrape read
        loads.loads = [(w, u) for w, _, u in (fleet.published(k, tick) for k in range(engines))]
        mine = client.route(r, float(now), Scraped.of(prompts[r], 16, loads))
        picks.append((mine, simulated.route(r, float(now), fleet)))  # type: ignore[arg-type]
    assert all(a == b for a, b in picks)
    chosen = [a for a, _ in picks]
    assert len(set(chosen)) == engines
    same = [chosen[i] == chosen[j] for i in range(n) for j in range(i) if blocks[i][:2] ==
            blocks[j][:2] and len(blocks[i]) >= 2]  # fmt: skip
    assert np.mean(same) > 0.6  # requests sharing 2 blocks mostly meet on one engine


def test_the_simulated_scrape_reads_the_last_tick() -> None:
    fleet = _Fleet([[(0.07, (5, 0, 0.9))], [(0.0, (0, 0, 0.0))]], [[], [], []])
    fleet.changes[1] = []
    router = ROUTERS["prefix_affinity"](2, 0, 0.05)
    # at 0.09 the last scrape (0.05) saw both engines empty: a tie, a seeded draw
    first = router.route(0, 0.09, fleet)  # type: ignore[arg-type]
    assert router.route(1, 0.10, fleet) == 1  # type: ignore[arg-type]  # the scrape at 0.10 saw it
    assert first in (0, 1)


def test_an_oracle_replay_decides_on_what_the_client_read_not_on_its_own_engines() -> None:
    """The client routes on its scrapes; the simulated router, its own engines' state different,
    sends every request where the client did once handed the client's reads (and not without)."""
    rng = np.random.default_rng(5)
    engines, n, poll_s = 2, 200, 0.05
    prefixes = [list(rng.integers(0, 1000, 64)) for _ in range(4)]
    prompts = [prefixes[int(rng.integers(4))][: int(rng.integers(16, 65))] for _ in range(n)]
    blocks = [chained_blocks(p, 16) for p in prompts]
    times = np.cumsum(rng.exponential(0.02, n))

    def changes() -> list[list[tuple[float, tuple[int, int, float]]]]:
        return [
            [(float(t), (int(rng.integers(0, 4)), 1, float(rng.uniform(0, 0.5)))) for t in
             np.sort(rng.uniform(0, times[-1], 60))]
            for _ in range(engines)
        ]  # fmt: skip

    real, own = _Fleet(changes(), blocks), _Fleet(changes(), blocks)  # two different histories
    client = CLIENT_ROUTERS["prefix_affinity"](engines, 7)
    loads = ServerLoads(["-"] * engines, poll_s, 64)
    chosen, reads = [], []
    for r, now in enumerate(times):
        tick = np.floor(now / poll_s) * poll_s
        loads.loads = [(w, u) for w, _, u in (real.published(k, tick) for k in range(engines))]
        view = Scraped.of(prompts[r], 16, loads)
        chosen.append(client.route(r, float(now), view))
        reads.append(view.loads)
    replayed = ROUTERS["prefix_affinity"](engines, 7, poll_s)
    replayed.recorded = reads  # type: ignore[attr-defined]
    on_reads = [replayed.route(r, float(t), own) for r, t in enumerate(times)]  # type: ignore[arg-type]
    assert on_reads == chosen
    alone = ROUTERS["prefix_affinity"](engines, 7, poll_s)
    on_own = [alone.route(r, float(t), own) for r, t in enumerate(times)]  # type: ignore[arg-type]
    assert on_own != chosen  # its own engines' state would have sent some elsewhere
    short = ROUTERS["prefix_affinity"](engines, 7, poll_s)
    short.recorded = [reads[0][:1]]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="read 1 engines' load, the fleet has 2"):
        short.route(0, 0.0, own)  # type: ignore[arg-type]
