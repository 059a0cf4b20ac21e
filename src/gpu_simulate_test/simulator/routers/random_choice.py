"""Uniformly at random, from a seeded generator (the baseline every balancer must beat). The
client's own (:mod:`gpu_simulate_test.core.routing`), as the real bench's client runs it."""

from __future__ import annotations

from gpu_simulate_test.core.routing import RandomChoice

__all__ = ("RandomChoice",)
