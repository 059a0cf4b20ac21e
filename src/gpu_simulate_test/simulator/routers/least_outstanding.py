"""Least outstanding requests: the engine with the fewest requests this client has in flight
(ties: the lowest index), the count it keeps itself, exact and never stale."""

from __future__ import annotations

from gpu_simulate_test.simulator.routers.base import FleetView, InFlight


class LeastOutstanding(InFlight):
    def route(self, r: int, now: float, fleet: FleetView) -> int:
        counts = self.inflight
        return self.sent(counts.index(min(counts)))
