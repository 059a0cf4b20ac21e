"""Uniformly at random, from a seeded generator (the baseline every balancer must beat)."""

from __future__ import annotations

import numpy as np

from gpu_simulate_test.simulator.routers.base import FleetView, InFlight


class RandomChoice(InFlight):
    def __init__(self, engines: int, seed: int) -> None:
        super().__init__(engines)
        self.rng = np.random.default_rng(seed)

    def route(self, r: int, now: float, fleet: FleetView) -> int:
        return self.sent(int(self.rng.integers(len(self.inflight))))
