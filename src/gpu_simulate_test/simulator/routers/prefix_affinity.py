"""``prefix_affinity`` in the simulated fleet: llm-d's scoring
(:class:`gpu_simulate_test.core.prefix_affinity.PrefixAffinity`, the same code the real client
routes by), reading each engine's waiting count and KV usage as a scrape every ``poll_s`` would
have found them: what the engine's last step before the scrape's tick left
(:meth:`FleetView.published`; the fleet records every step's state for a router that
:attr:`scrapes`, and steps its engines one step at a time, as a server's gauges move with every
step). ``poll_s=0`` reads the engines live.

The ticks fall at ``k * poll_s`` on the simulation's clock; a real client's poller runs at an
unknown phase against the requests, so a decision may differ where a count changed between the
two ticks (the staleness, as vLLM's coordinator's for ``vllm_dp``). An oracle replay of a real
fleet hands the router what the real client read instead (:attr:`PrefixAffinity.recorded`,
``router_reads.csv``), so that its decisions can be held equal to the client's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpu_simulate_test.core.prefix_affinity import POLL_S, WEIGHTS
from gpu_simulate_test.core.prefix_affinity import PrefixAffinity as Scoring
from gpu_simulate_test.simulator.routers.base import FleetView

__all__ = ("POLL_S", "PrefixAffinity")


class _Scraped:
    """A :class:`FleetView` as the router's scrapes of it (an ``AffinityView``)."""

    def __init__(self, fleet: FleetView, poll_s: float) -> None:
        self.fleet, self.poll_s = fleet, poll_s

    def prompt_blocks(self, r: int) -> list[int]:
        return self.fleet.prompt_blocks(r)

    def polled(self, engine: int, now: float) -> tuple[int, float]:
        if self.poll_s <= 0:
            live = self.fleet.engines[engine]
            return live.num_waiting, live.kv_usage()
        waiting, _running, usage = self.fleet.published(
            engine, math.floor(now / self.poll_s) * self.poll_s
        )
        return waiting, usage

    def num_blocks(self, engine: int) -> int:
        return self.fleet.engines[engine].params.num_blocks


class _Recorded(_Scraped):
    """A :class:`FleetView` whose load is what the real client's router read for one request."""

    def __init__(self, fleet: FleetView, loads: list[tuple[int, float]]) -> None:
        super().__init__(fleet, 0.0)
        self.loads = loads

    def polled(self, engine: int, now: float) -> tuple[int, float]:
        return self.loads[engine]


class PrefixAffinity(Scoring):
    recorded: Sequence[list[tuple[int, float]] | None] | None = None
    """Per request, the loads the real client's router read (an oracle replay); None: the
    simulated engines' as scraped."""

    def __init__(
        self,
        engines: int,
        seed: int,
        weights: tuple[float, float, float] = WEIGHTS,
        poll_s: float = POLL_S,
    ) -> None:
        super().__init__(engines, seed, weights)
        self.poll_s = poll_s

    def route(self, r: int, now: float, fleet: FleetView) -> int:  # type: ignore[override]
        read = self.recorded[r] if self.recorded is not None else None
        if read is not None:
            if len(read) != len(self.index):
                raise ValueError(
                    f"request {r}: the real router read {len(read)} engines' load, the fleet "
                    f"has {len(self.index)}"
                )
            return super().route(r, now, _Recorded(fleet, read))
        return super().route(r, now, _Scraped(fleet, self.poll_s))
