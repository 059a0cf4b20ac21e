"""Prefix affinity, as llm-d's inference scheduler scores endpoints: a weighted sum of three
scores in [0, 1], the highest total wins (ties: a seeded draw among them).

- **prefix**: the share of the prompt's full blocks, from its start, that the router has sent
  to that engine before (llm-d's approximate prefix-cache scorer: the router's own index of the
  block hashes it routed, per engine, least recently used dropped beyond the engine's cache
  size in blocks);
- **queue**: ``(max - waiting) / (max - min)`` over the engines' waiting counts (1 for all when
  they are equal);
- **kv**: ``1 - kv_usage``.

The queue and KV usage are read live (llm-d scrapes each server's metrics every few tens of
milliseconds; that staleness is not modelled).

Default weights: prefix 3, queue 2, kv 2 (llm-d's default profile weighs the prefix scorer 3
and the queue scorer 2; the KV-usage scorer 2 as its load-aware guides add it).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from gpu_simulate_test.simulator.routers.base import FleetView, InFlight

WEIGHTS = (3.0, 2.0, 2.0)
"""Prefix, queue, KV usage."""


class PrefixAffinity(InFlight):
    reads_live = True

    def __init__(
        self, engines: int, seed: int, weights: tuple[float, float, float] = WEIGHTS
    ) -> None:
        super().__init__(engines)
        self.weights = weights
        self.rng = np.random.default_rng(seed)
        self.index: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(engines)]
        """Per engine, the block hashes routed there, least recently used first."""

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

    def route(self, r: int, now: float, fleet: FleetView) -> int:
        n = len(self.index)
        blocks = fleet.prompt_blocks(r)
        engines = fleet.engines
        waiting = [engines[k].num_waiting for k in range(n)]
        usage = [engines[k].kv_usage() for k in range(n)]
        low, high = min(waiting), max(waiting)
        queue = [1.0 if high == low else (high - w) / (high - low) for w in waiting]
        prefix = self.prefix_scores(blocks)
        w_prefix, w_queue, w_kv = self.weights
        totals = [
            w_prefix * prefix[k] + w_queue * queue[k] + w_kv * (1.0 - usage[k]) for k in range(n)
        ]
        best = max(totals)
        tied = [k for k in range(n) if totals[k] == best]
        k = tied[0] if len(tied) == 1 else tied[int(self.rng.integers(len(tied)))]
        self._remember(k, blocks, fleet.engines[k].params.num_blocks)
        return self.sent(k)

    def _remember(self, k: int, blocks: list[int], capacity: int) -> None:
        seen = self.index[k]
        for key in blocks:
            seen[key] = None
            seen.move_to_end(key)
        while len(seen) > capacity:
            seen.popitem(last=False)
