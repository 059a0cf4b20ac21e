"""Round robin: engine 0, 1, ..., N-1, 0, ... in the order requests are sent (a Kubernetes
service's spread, vLLM production-stack's default router). The client's own
(:mod:`gpu_simulate_test.core.routing`): the real bench's client in front of N servers routes by
the same code."""

from __future__ import annotations

from gpu_simulate_test.core.routing import RoundRobin

__all__ = ("RoundRobin",)
