"""A fleet's settings (``fleet.*``): how many replicas of the engine, behind which router."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpu_simulate_test.config.schema import _check, _check_choice

FLEET_ROUTERS: tuple[str, ...] = (
    "vllm_dp",
    "round_robin",
    "least_outstanding",
    "prefix_affinity",
    "random",
)
"""The routers by name (``gpu_simulate_test.simulator.routers.ROUTERS`` has one per name)."""


@dataclass(frozen=True)
class FleetConfig:
    """``fleet.replicas=N fleet.router=vllm_dp``: N engines (one GPU each) behind a router."""

    replicas: int = 1
    """Engines, one GPU each (vLLM's ``--data-parallel-size``, or N servers behind a router)."""
    router: str = "vllm_dp"
    """``vllm_dp``: vLLM's own data-parallel balancer (``vllm serve --data-parallel-size N
    --api-server-count 1``); ``round_robin``; ``least_outstanding`` (fewest in flight);
    ``prefix_affinity`` (prefix-cache hits, queue depth and KV usage, as llm-d scores);
    ``random``."""
    poll_s: float = 0.05
    """How often ``prefix_affinity`` scrapes each engine's waiting requests and KV usage
    (llm-d's endpoint picker: 50 ms; the real client's ``backend.router_poll_s``); 0 reads the
    engines live."""

    router_seed: int = 0
    """The seed of the router's draws (``random``; ``prefix_affinity``'s ties), as the real
    client's router draws (the same seed: the same draws)."""

    def __post_init__(self) -> None:
        _check(self.replicas >= 1, f"fleet.replicas must be at least 1, got {self.replicas}")
        _check(
            math.isfinite(self.poll_s) and self.poll_s >= 0,
            f"fleet.poll_s must be a finite number of seconds >= 0 (0: live), got {self.poll_s}",
        )
        _check(self.router_seed >= 0, f"fleet.router_seed must be >= 0, got {self.router_seed}")
        _check_choice("fleet.router", self.router, FLEET_ROUTERS)
