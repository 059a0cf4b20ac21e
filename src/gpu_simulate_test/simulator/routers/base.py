"""What a router sees and decides (:class:`Router`), and the engines' state as it reaches a
router (:class:`FleetView`)."""

from __future__ import annotations

from typing import Protocol

from gpu_simulate_test.core.routing import InFlight
from gpu_simulate_test.simulator.engine import VllmV1Engine

__all__ = ("FleetView", "InFlight", "Router")


class FleetView(Protocol):
    """The fleet as a router may read it at the moment it routes."""

    @property
    def engines(self) -> list[VllmV1Engine]:
        """The engines, by index (their live state: what a router in the same process reads)."""
        ...

    def published(self, engine: int, at: float) -> tuple[int, int, float]:
        """(waiting, running, KV usage) of ``engine`` as its last step that ended by ``at``
        left them (what an engine publishes after a step; (0, 0, 0.0) before any step)."""
        ...

    def prompt_blocks(self, r: int) -> list[int]:
        """The hashes of request ``r``'s full prompt blocks (equal hashes: equal tokens up to
        that block's end, vLLM's chained block hash); empty without prefix caching."""
        ...


class Router(Protocol):
    """Chooses an engine per request, told when a request it routed has finished."""

    reads_live: bool
    """Whether it reads the engines' live state (:attr:`FleetView.engines`; then the fleet
    steps each engine one step at a time); else it reads only its own counts and what the
    engines publish, and the engines take stretches of decode steps between sends."""

    def route(self, r: int, now: float, fleet: FleetView) -> int:
        """The engine request ``r``, sent at ``now``, goes to."""
        ...

    def finished(self, r: int, engine: int, now: float) -> None:
        """Request ``r``'s last output reached the router at ``now``."""
        ...
