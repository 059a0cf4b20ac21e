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


class InFlight:
    """Requests routed and not yet finished, per engine, as the client counts them (the base of
    the routers that read only their own counts)."""

    reads_live = False
    """It reads no engine's state (the simulator's fleet may step engines in stretches)."""
    scrapes = False
    """It reads each engine's load (waiting requests, KV usage) as last scraped, and the
    prompt's blocks (:class:`~.prefix_affinity.AffinityView`)."""

    def __init__(self, engines: int) -> None:
        self.inflight = [0] * engines

    def sent(self, engine: int) -> int:
        self.inflight[engine] += 1
        return engine

    def finished(self, r: int, engine: int, now: float) -> None:
        """Request ``r``'s last output reached the router at ``now``."""
        self.inflight[engine] -= 1


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


def _prefix_affinity(engines: int, seed: int) -> ClientRouter:
    from gpu_simulate_test.core.prefix_affinity import PrefixAffinity

    return PrefixAffinity(engines, seed)


CLIENT_ROUTERS: Mapping[str, Callable[[int, int], ClientRouter]] = MappingProxyType(
    {
        "round_robin": lambda engines, seed: RoundRobin(engines),
        "least_outstanding": lambda engines, seed: LeastOutstanding(engines),
        "random": lambda engines, seed: RandomChoice(engines, seed),
        "prefix_affinity": _prefix_affinity,
    }
)
"""A client's router by name, made for (number of engines, seed)."""
