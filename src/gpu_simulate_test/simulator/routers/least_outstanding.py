"""Least outstanding requests: the engine with the fewest requests this client has in flight
(ties: the lowest index), the count it keeps itself, exact and never stale. The client's own
(:mod:`gpu_simulate_test.core.routing`), as the real bench's client runs it."""

from __future__ import annotations

from gpu_simulate_test.core.routing import LeastOutstanding

__all__ = ("LeastOutstanding",)
