"""vLLM 0.32's data-parallel balancer (``DPLBAsyncMPClient.get_core_engine_for_request`` in
``vllm/v1/engine/core_client.py``, with the coordinator of ``vllm/v1/engine/coordinator.py``),
for a dense model, where each rank is an independent engine.

The client keeps, per engine, ``[waiting, running, kv_usage]`` as the coordinator last sent
them, and its own exact count of the requests it has in flight there. A request goes to the
engine of the lowest score ``max(client_count * inflight, waiting + running)``, plus
``6 * waiting * max(0, kv_usage - 0.5)`` when anything waits, scanning from a start index that
advances by one after every decision (ties: the first met); the chosen engine's waiting count is
raised by ``client_count`` locally until the coordinator's next message replaces the counts.

Staleness: an engine publishes its counts after a step when they changed, with its KV usage
of that moment (:meth:`FleetView.published`); the
coordinator sends them to the clients on a ``tick_s`` (100 ms) timer when they changed since its
last message, and every ``idle_tick_s`` (5 s) when they did not. With ``--api-server-count 1``
there is one client (``client_count`` 1, start index 0).
"""

from __future__ import annotations

import math

from gpu_simulate_test.simulator.routers.base import FleetView

COORDINATOR_TICK_S = 0.1
"""How often vLLM's coordinator sends changed counts to the clients."""
COORDINATOR_IDLE_TICK_S = 5.0
"""How often it sends them when nothing changed."""


class VllmDataParallel:
    reads_live = False

    def __init__(
        self,
        engines: int,
        client_count: int = 1,
        client_index: int = 0,
        tick_s: float = COORDINATOR_TICK_S,
        idle_tick_s: float = COORDINATOR_IDLE_TICK_S,
        phase_s: float = 0.0,
    ) -> None:
        self.client_count = client_count
        self.lb_engines: list[list[float]] = [[0, 0, 0.0] for _ in range(engines)]
        """Per engine: waiting, running, KV usage, as last received and raised locally."""
        self.inflight = [0] * engines
        """This client's unfinished requests per engine (exact)."""
        self.start_index = (engines * client_index) // client_count
        self.tick_s, self.idle_tick_s = tick_s, idle_tick_s
        self.phase_s = phase_s
        """Where the coordinator's timer stands against the simulation's clock: its ticks fall
        at ``phase_s + k * tick_s`` (a real server's phase is unknown; a benchmark sweeps it)."""
        self._tick = -1
        self._sent: list[tuple[int, int, float]] | None = None
        self._sent_at = -math.inf

    def route(self, r: int, now: float, fleet: FleetView) -> int:
        self._coordinator(now, fleet)
        return self.choose()

    def finished(self, r: int, engine: int, now: float) -> None:
        self.inflight[engine] -= 1

    def receive(self, counts: list[list[float]]) -> None:
        """The coordinator's message: the counts replace the client's (local raises dropped)."""
        self.lb_engines = [list(c) for c in counts]

    def choose(self) -> int:
        """vLLM's decision on the counts the client holds now, and its bookkeeping after it."""
        counts = self.lb_engines
        n = len(counts)
        best, chosen = float(2**63 - 1), 0
        for i in range(n):
            idx = (self.start_index + i) % n
            waiting, running, usage = counts[idx]
            score = float(max(self.client_count * self.inflight[idx], waiting + running))
            if waiting:
                score += waiting * 6.0 * max(0.0, usage - 0.5)
            if score < best:
                best, chosen = score, idx
        counts[chosen][0] += self.client_count
        self.start_index = (self.start_index + 1) % n
        self.inflight[chosen] += 1
        return chosen

    def _coordinator(self, now: float, fleet: FleetView) -> None:
        """The coordinator's messages up to ``now``: at each of its ticks since the last route,
        the engines' counts as published by then, sent when they differ from its last message or
        ``idle_tick_s`` has passed since it; each replaces what the client holds."""
        tick = math.floor((now - self.phase_s) / self.tick_s)
        engines = range(len(self.lb_engines))
        for k in range(self._tick + 1, tick + 1):
            at = self.phase_s + k * self.tick_s
            counts = [fleet.published(e, at) for e in engines]
            if counts != self._sent or at - self._sent_at >= self.idle_tick_s:
                self._sent, self._sent_at = counts, at
                self.receive([list(c) for c in counts])
        self._tick = max(self._tick, tick)
