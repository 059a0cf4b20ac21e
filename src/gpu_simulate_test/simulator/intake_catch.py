"""A step's end waits for the requests the API server is taking in: the intake's catch.

On this project's CPU host vLLM's API server takes a request in (HTTP, parsing, tokenizing,
the hop to the engine core) on the core the engine core runs on. Measured on five fresh main
jobs (``benchmarks/results/intake_catch_20261205``): of the busy requests whose step ended
between 0.7 and 2 ms after their send, none was left behind; every such end moved out to
2.4–3.3 ms after the send, right as the request reached the engine core (its step end
0.06 ms before it was queued), and the request went into the very next step. The engine core
cannot close its step while the intake holds the core, and when it can the request is in.
Without that, a simulated request sent in a step's last two milliseconds reached the engine
just after the step ended and waited a whole step (8 ms on the tiny model): a quarter of the
main job's busy requests against a tenth measured, the front end's p90 long.

So a step whose end (as timed) falls after a request's send and before the request reaches
the engine (its simulated arrival: the send and the calibrated way in) ends at that arrival,
and the request is taken in at that step's end, as vLLM takes in what its input queue holds
between steps. Each moved end is checked again against the intakes under way by then.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Intakes:
    """The requests' sends and arrivals at the engine, in the order of their sends."""

    sends_s: list[float]
    arrivals_s: np.ndarray
    longest_s: float
    """The longest way in (arrival less send): no send earlier than that before a step's end
    is still being taken in."""

    @classmethod
    def of(
        cls,
        sends: Sequence[float] | np.ndarray | None,
        arrivals: Sequence[float] | np.ndarray | None,
    ) -> Intakes | None:
        """The intakes of the requests both known ahead (a closed loop's later turns have a NaN
        send); None without both, or when none is."""
        if sends is None or arrivals is None:
            return None
        sent = np.asarray(sends, dtype=float)
        arrived = np.asarray(arrivals, dtype=float)
        if sent.shape != arrived.shape:
            raise ValueError(
                f"intake catch: {len(sent)} sends against {len(arrived)} arrivals; one each"
            )
        known = np.isfinite(sent) & np.isfinite(arrived)
        if not known.any():
            return None
        sent, arrived = sent[known], arrived[known]
        order = np.argsort(sent, kind="stable")
        sent, arrived = sent[order], arrived[order]
        longest = float(np.max(arrived - sent))
        return cls([float(t) for t in sent], arrived, max(longest, 0.0))

    def end_s(self, end: float) -> float:
        """A step's end (as timed) moved to the latest arrival of the requests sent before it
        and not yet at the engine by then, until none is."""
        sends, arrivals = self.sends_s, self.arrivals_s
        while True:
            lo = bisect.bisect_left(sends, end - self.longest_s)
            hi = bisect.bisect_left(sends, end)
            if hi <= lo:
                return end
            latest = float(arrivals[lo:hi].max())
            if latest <= end:
                return end
            end = latest
