"""Vidur's own loop (``vidur.simulator.Simulator``) as an engine a caller steps:
:class:`VidurEngine`, the interface of :class:`~gpu_simulate_test.simulator.engine.VllmV1Engine`
and :class:`~.aggregate_engine.AggregateEngine` over Vidur's event heap.

Vidur's ``Simulator.run`` pops events in priority order (time, then creation) and pushes what
each one's handler returns. Here the requests Vidur's generator made are held back until a
caller adds them (:meth:`VidurEngine.add` pushes their ``RequestArrivalEvent``), and the heap is
taken an event at a time (:meth:`VidurEngine.step`) or up to a horizon
(:meth:`VidurEngine.advance`), then :meth:`VidurEngine.close` checks that nothing is left and
writes Vidur's output, as ``run`` does. Every request added at its own arrival, then advanced to
the end, is ``Simulator.run`` event for event (the events are the generator's own, created in
the same order): ``tests/unit/vidur_simulate/test_vidur_engine.py`` holds the two equal.

A router reads :attr:`VidurEngine.num_waiting`, :attr:`VidurEngine.num_running` and
:meth:`VidurEngine.kv_usage` of the simulator's replicas together.
"""

from __future__ import annotations

import heapq
import math
from typing import Any


class VidurEngine:
    """A built ``vidur.simulator.Simulator`` (its predictor and metric store as the caller set
    them), stepped an event at a time."""

    def __init__(self, simulator: Any) -> None:
        self._sim = simulator
        queue = simulator._event_queue
        events = [event for _, event in sorted(queue, key=lambda item: item[0])]
        queue.clear()
        self._arrivals = {event._request.id: event for event in events}
        """Vidur's own arrival event per request id (the trace's order), pushed when added."""
        self.steps = 0
        """Events handled."""

    @property
    def simulator(self) -> Any:
        return self._sim

    @property
    def request_ids(self) -> list[int]:
        """The requests Vidur's generator made, by arrival (each may be added once)."""
        return sorted(self._arrivals, key=lambda r: self._arrivals[r]._priority_number)

    def add(self, r: int, at: float | None = None) -> None:
        """Request ``r`` (Vidur's request id) arrives at ``at`` (default: its trace arrival)."""
        from vidur.events import RequestArrivalEvent

        event = self._arrivals.pop(r)
        if at is not None and at != event.time:
            request = event._request
            request._arrived_at = at
            event = RequestArrivalEvent(at, request)
        heapq.heappush(self._sim._event_queue, (event._priority_number, event))

    def add_all(self) -> None:
        """Every request at its trace arrival."""
        for r in self.request_ids:
            self.add(r)

    def next_start(self) -> float:
        """The time of the next event (inf: nothing to do, or Vidur's time limit was reached)."""
        queue = self._sim._event_queue
        if not queue or self._sim._terminate:
            return math.inf
        return float(queue[0][1].time)

    def step(self) -> None:
        """Handle the next event, as one turn of ``Simulator.run``'s loop."""
        sim = self._sim
        _, event = heapq.heappop(sim._event_queue)
        sim._set_time(event._time)
        sim._add_events(event.handle_event(sim._scheduler, sim._metric_store))
        metrics = sim._config.metrics_config
        if metrics.write_json_trace:
            sim._event_trace.append(event.to_dict())
        if metrics.enable_chrome_trace:
            trace = event.to_chrome_trace_events()
            if trace:
                sim._event_chrome_trace.extend(trace)
        self.steps += 1

    def advance(self, until: float = math.inf) -> None:
        """Handle every event due before ``until`` (all of them by default)."""
        while self.next_start() < until:
            self.step()

    def close(self) -> None:
        """End as ``Simulator.run`` does: every added request finished (or the time limit
        reached), then Vidur's output written."""
        sim = self._sim
        scheduler = sim._scheduler
        assert scheduler.is_empty() or sim._terminate, (
            f"Simulation ended with pending requests {scheduler.get_pending_requests()}"
        )
        sim._write_output()

    def _replicas(self) -> list[Any]:
        return list(self._sim._scheduler._replica_schedulers.values())

    @property
    def num_waiting(self) -> int:
        """Requests not yet given KV blocks: Vidur's global queue and its replicas' queues."""
        queued = sum(r.num_pending_requests for r in self._replicas())
        return len(self._sim._scheduler._request_queue) + queued

    @property
    def num_running(self) -> int:
        """Requests holding KV blocks."""
        return sum(len(r._allocation_map) for r in self._replicas())

    def kv_usage(self) -> float:
        """The share of KV blocks allocated, over the replicas."""
        replicas = self._replicas()
        total = sum(r._cache_config.num_blocks for r in replicas)
        return sum(r.num_allocated_blocks for r in replicas) / total if total else 0.0
