"""Round robin: engine 0, 1, ..., N-1, 0, ... in the order requests are sent (a Kubernetes
service's spread, vLLM production-stack's default router)."""

from __future__ import annotations

from gpu_simulate_test.simulator.routers.base import FleetView, InFlight


class RoundRobin(InFlight):
    def __init__(self, engines: int) -> None:
        super().__init__(engines)
        self.next = 0

    def route(self, r: int, now: float, fleet: FleetView) -> int:
        engine = self.next
        self.next = (engine + 1) % len(self.inflight)
        return self.sent(engine)
