"""A step's end waits for the requests the API server is taking in: the intake's catch
(``vidur.intake_catch``, off).

On this project's CPU host vLLM's API server takes a request in (HTTP, parsing, tokenizing,
the hop to the engine core) on the core the engine core runs on. On fifteen fresh main jobs
(``benchmarks/results/intake_catch_20261205``) a busy request's step seldom ended 0.7–2 ms
after its send (10 of 234 busy sends; the simulation 43 of 236) and its ends piled up 2–3.5 ms
after it, right as the request reached the engine core (the step's end 0.06 ms before the
request was queued), the request going into the very next step: the engine core cannot close
its step while the intake holds the core. The simulation's request, sent late in a step, reached the
engine just after the step ended and waited a whole one.

So here a step whose end (as timed) falls after a request's send and before the request
reaches the engine (its simulated arrival: the send and the calibrated way in) ends at that
arrival, and the request is taken in at that step's end, as vLLM takes in what its input queue
holds between steps; each moved end is checked again against the intakes under way by then.
Off by default: taken in full it over-corrects. The real engine still missed a fifth of the
ends 2–3.5 ms after the send, and its misses waited a step and more; with the catch the
simulated way in had almost none, and every client TTFT figure read shorter (inside the
truth's spread).
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
