"""The routers a client runs between engines from its own counts alone: round robin, least
outstanding, random (and, reading each engine's scraped load, prefix affinity:
:mod:`.prefix_affinity`). One implementation serves both sides: the real bench's client in front of
``backend.servers`` servers, and the simulator's fleet (``gpu_simulate_test.simulator.routers``
registers these same classes), so a real fleet and its simulation route by the same code."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Protocol

import numpy as np

from gpu_simulate_test.core.in_flight import InFlight
from gpu_simulate_test.core.prefix_affinity import PrefixAffinity

__all__ = (
    "CLIENT_ROUTERS",
    "ROUTER_SEED",
    "ClientRouter",
    "InFlight",
    "LeastOutstanding",
    "RandomChoice",
    "RoundRobin",
)

ROUTER_SEED = 0
"""The seed of a router's draws (``random``; ``prefix_affinity``'s ties), the client's and the
simulated fleet's alike (``fleet.router_seed``), so that they draw the same."""


class ClientRouter(Protocol):
    """What a client's router does: choose an engine per request from its own counts, told
    when a request it routed has finished."""

    def route(self, r: int, now: float, fleet: Any) -> int:
        """The engine request ``r``, sent at ``now``, goes to (``fleet``: what a router that
        reads the engines' load sees, :class:`~.prefix_affinity.AffinityView`)."""
        ...

    def finished(self, r: int, engine: int, now: float) -> None:
        """Request ``r``'s last output reached the router at ``now``."""
        ...


class RoundRobin(InFlight):
    """Engine 0, 1, ..., N-1, 0, ... in the order requests are sent (a Kubernetes service's
    spread, vLLM production-stack's default router)."""

    def __init__(self, engines: int) -> None:
        super().__init__(engines)
        self.next = 0

    def route(self, r: int, now: float, fleet: object = None) -> int:
        engine = self.next
        self.next = (engine + 1) % len(self.inflight)
        return self.sent(engine)


class LeastOutstanding(InFlight):
    """The engine with the fewest requests this client has in flight (ties: the lowest index),
    the count it keeps itself, exact and never stale."""

    def route(self, r: int, now: float, fleet: object = None) -> int:
        counts = self.inflight
        return self.sent(counts.index(min(counts)))


class RandomChoice(InFlight):
    """Uniformly at random, from a seeded generator (the baseline every balancer must beat)."""

    def __init__(self, engines: int, seed: int) -> None:
        super().__init__(engines)
        self.rng = np.random.default_rng(seed)

    def route(self, r: int, now: float, fleet: object = None) -> int:
        return self.sent(int(self.rng.integers(len(self.inflight))))


CLIENT_ROUTERS: Mapping[str, Callable[[int, int], ClientRouter]] = MappingProxyType(
    {
        "round_robin": lambda engines, seed: RoundRobin(engines),
        "least_outstanding": lambda engines, seed: LeastOutstanding(engines),
        "random": lambda engines, seed: RandomChoice(engines, seed),
        "prefix_affinity": lambda engines, seed: PrefixAffinity(engines, seed),
    }
)
"""A client's router by name, made for (number of engines, seed)."""
