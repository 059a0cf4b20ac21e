"""The base of a client's routers: the requests it routed and not yet finished, per engine, as
it counts them itself (:mod:`.routing`, :mod:`.prefix_affinity`)."""

from __future__ import annotations


class InFlight:
    """Requests routed and not yet finished, per engine, as the client counts them (the base of
    the routers that read only their own counts)."""

    reads_live = False
    """It reads no engine's state (the simulator's fleet may step engines in stretches)."""
    scrapes = False
    """It reads each engine's load (waiting requests, KV usage) as last scraped, and the
    prompt's blocks (:class:`~.prefix_affinity.AffinityView`)."""

    def __init__(self, engines: int) -> None:
        self.inflight = [0] * engines

    def sent(self, engine: int) -> int:
        self.inflight[engine] += 1
        return engine

    def finished(self, r: int, engine: int, now: float) -> None:
        """Request ``r``'s last output reached the router at ``now``."""
        self.inflight[engine] -= 1
