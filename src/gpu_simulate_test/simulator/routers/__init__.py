"""Routers of a fleet (:mod:`..fleet`): which engine a request goes to, one module per policy
over one small interface (:class:`.base.Router`), registered in :data:`ROUTERS` by name as the
engines are in :mod:`..registry`.

- ``vllm_dp``: vLLM 0.32's data-parallel balancer (:mod:`.vllm_dp`), the published counts'
  staleness included;
- ``round_robin``: in turn (a Kubernetes service, vLLM's production-stack default);
- ``least_outstanding``: the fewest requests in flight, as the client counts them;
- ``prefix_affinity``: prefix-cache hits, queue depth and KV usage, as llm-d scores them
  (:mod:`.prefix_affinity`);
- ``random``: uniformly at random, seeded.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Protocol

from gpu_simulate_test.simulator.routers.base import Router
from gpu_simulate_test.simulator.routers.least_outstanding import LeastOutstanding
from gpu_simulate_test.simulator.routers.prefix_affinity import POLL_S, PrefixAffinity
from gpu_simulate_test.simulator.routers.random_choice import RandomChoice
from gpu_simulate_test.simulator.routers.round_robin import RoundRobin
from gpu_simulate_test.simulator.routers.vllm_dp import VllmDataParallel


class RouterFactory(Protocol):
    def __call__(self, engines: int, seed: int, poll_s: float = POLL_S) -> Router:
        """A router for ``engines`` engines, its draws from ``seed``; a router that scrapes the
        engines' load does so every ``poll_s`` (0: live)."""
        ...


ROUTERS: Mapping[str, RouterFactory] = MappingProxyType(
    {
        "vllm_dp": lambda engines, seed, poll_s=POLL_S: VllmDataParallel(engines),
        "round_robin": lambda engines, seed, poll_s=POLL_S: RoundRobin(engines),
        "least_outstanding": lambda engines, seed, poll_s=POLL_S: LeastOutstanding(engines),
        "prefix_affinity": lambda engines, seed, poll_s=POLL_S: PrefixAffinity(
            engines, seed, poll_s=poll_s
        ),
        "random": lambda engines, seed, poll_s=POLL_S: RandomChoice(engines, seed),
    }
)
"""A router by name, made for (number of engines, seed, scrape interval)."""
