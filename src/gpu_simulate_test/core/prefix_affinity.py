"""Prefix affinity, as llm-d's inference scheduler scores endpoints: a weighted sum of three
scores in [0, 1], the highest total wins (ties: a seeded draw among them). One implementation
serves both sides: the real bench's client in front of ``backend.servers`` servers and the
simulator's fleet (``fleet.router=prefix_affinity``).

- **prefix**: the share of the prompt's full blocks, from its start, that the router has sent
  to that engine before (llm-d's approximate prefix-cache scorer: the router's own index of the
  block hashes it routed, per engine, least recently used dropped beyond the engine's cache
  size in blocks);
- **queue**: ``(max - waiting) / (max - min)`` over the engines' waiting counts (1 for all when
  they are equal);
- **kv**: ``1 - kv_usage``.

The waiting counts and KV usage are what the router last scraped (llm-d's endpoint picker reads
each server's ``/metrics`` every 50 ms, :data:`POLL_S`): the real client polls each server's
``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc``; the simulated fleet reads what
each engine's last step by the poll's tick left (:meth:`AffinityView.polled`).

Default weights: prefix 3, queue 2, kv 2 (llm-d's default profile weighs the prefix scorer 3
and the queue scorer 2; the KV-usage scorer 2 as its load-aware guides add it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from gpu_simulate_test.core.in_flight import InFlight

WEIGHTS = (3.0, 2.0, 2.0)
"""Prefix, queue, KV usage."""
POLL_S = 0.05
"""How often the router scrapes each engine's load (llm-d's endpoint picker: 50 ms)."""


class AffinityView(Protocol):
    """What the prefix-affinity router reads of a fleet when it routes."""

    def prompt_blocks(self, r: int) -> list[int]:
        """The keys of request ``r``'s full prompt blocks (equal keys: equal tokens up to that
        block's end, as vLLM's chained block hash)."""
        ...

    def polled(self, engine: int, now: float) -> tuple[int, float]:
        """(waiting requests, KV usage in [0, 1]) of ``engine`` as the router last read them
        by ``now``."""
        ...

    def num_blocks(self, engine: int) -> int:
        """``engine``'s KV cache in blocks (the index keeps at most that many)."""
        ...


def chained_blocks(tokens: Sequence[int], block_size: int) -> list[int]:
    """The keys of ``tokens``' full blocks of ``block_size``, each chained to the one before
    (two prompts share a key exactly where they share every token up to that block's end)."""
    keys: list[int] = []
    key = 0
    for end in range(block_size, len(tokens) + 1, block_size):
        key = hash((key, tuple(tokens[end - block_size : end])))
        keys.append(key)
    return keys


class PrefixAffinity(InFlight):
    """llm-d's scoring over the fleet's scraped load and the router's own block index."""

    scrapes = True
    reads_live = True  # the simulated fleet steps its engines one step at a time for it

    def __init__(
        self, engines: int, seed: int, weights: tuple[float, float, float] = WEIGHTS
    ) -> None:
        super().__init__(engines)
        self.weights = weights
        self.rng = np.random.default_rng(seed)
        self.index: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(engines)]
        """Per engine, the block keys routed there, least recently used first."""

    def prefix_scores(self, blocks: list[int]) -> list[float]:
        """Per engine, the share of ``blocks`` matched from the start in its index."""
        if not blocks:
            return [0.0] * len(self.index)
        scores = []
        for seen in self.index:
            matched = 0
            for key in blocks:
                if key not in seen:
                    break
                matched += 1
            scores.append(matched / len(blocks))
        return scores

    def route(self, r: int, now: float, fleet: AffinityView) -> int:
        n = len(self.index)
        blocks = fleet.prompt_blocks(r)
        loads = [fleet.polled(k, now) for k in range(n)]
        waiting = [w for w, _ in loads]
        low, high = min(waiting), max(waiting)
        queue = [1.0 if high == low else (high - w) / (high - low) for w in waiting]
        prefix = self.prefix_scores(blocks)
        w_prefix, w_queue, w_kv = self.weights
        totals = [
            w_prefix * prefix[k] + w_queue * queue[k] + w_kv * (1.0 - loads[k][1]) for k in range(n)
        ]
        best = max(totals)
        tied = [k for k in range(n) if totals[k] == best]
        k = tied[0] if len(tied) == 1 else tied[int(self.rng.integers(len(tied)))]
        self._remember(k, blocks, fleet.num_blocks(k))
        return self.sent(k)

    def _remember(self, k: int, blocks: list[int], capacity: int) -> None:
        seen = self.index[k]
        for key in blocks:
            seen[key] = None
            seen.move_to_end(key)
        while len(seen) > capacity:
            seen.popitem(last=False)
