"""The engine's own clock: vLLM's engine-core stamps of a request as times on the run clock.

vLLM's engine core, a process of its own, stamps a request with ``time.monotonic()`` when its
scheduler queues it, first schedules it, and when a step's outputs leave it (``queued_ts``,
``scheduled_ts``, ``first_token_ts``, ``last_token_ts`` of ``RequestStateStats``); the replay's
clock is ``time.perf_counter()`` here. On Linux both read ``CLOCK_MONOTONIC``, one clock for the
whole machine, so a stamp taken in the engine core is on the replay's time line. That is checked,
not assumed: :func:`link_clocks` measures this process's ``perf_counter() − monotonic()`` (0 on
Linux) and checks that another process's ``monotonic()`` falls between two ``perf_counter()``
readings taken around it; :func:`out_of_order` checks each request's stamps against what the
client itself saw of it.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

CHILD_CLOCK = ("-I", "-S", "-c", "import time; print(repr(time.monotonic()))")
"""A Python process that prints its ``time.monotonic()`` (isolated, no site: quick to start)."""


class ClockError(RuntimeError):
    """Another process's monotonic clock is not this process's ``perf_counter`` time line."""


@dataclass(frozen=True)
class ClockLink:
    """How a ``time.monotonic()`` reading of any process maps onto ``perf_counter()`` here."""

    offset_s: float
    """``perf_counter() − monotonic()`` in this process (0 where both are CLOCK_MONOTONIC)."""
    check_window_s: float = float("nan")
    """Width of the ``perf_counter`` bracket a child's ``monotonic()`` reading fell in."""
    wall_offset_s: float = float("nan")
    """``perf_counter() − time.time()`` in this process, for the front end's wall-clock
    stamp (``arrival_time``); NaN: not measured."""

    def to_perf_counter(self, monotonic_s: float) -> float:
        """A ``time.monotonic()`` reading as a ``time.perf_counter()`` reading of this process."""
        return monotonic_s + self.offset_s

    def wall_to_perf_counter(self, wall_s: float) -> float:
        """A ``time.time()`` reading of this process as a ``time.perf_counter()`` reading."""
        return wall_s + self.wall_offset_s

    def now(self) -> ClockLink:
        """This link with the wall clock's offset measured again, now: ``time.time()`` is not
        monotonic (NTP steps it, as on a machine that has just booted), so a wall-clock stamp
        is put on the run clock with the offset of the moment it was taken, not of the start."""
        return replace(self, wall_offset_s=wall_offset_s(3))


def wall_offset_s(samples: int = 7) -> float:
    """``perf_counter() − time.time()`` here, from the narrowest of ``samples`` brackets."""
    best_width, best_offset = float("inf"), 0.0
    for _ in range(samples):
        before = time.perf_counter()
        wall = time.time()
        after = time.perf_counter()
        if after - before < best_width:
            best_width, best_offset = after - before, (before + after) / 2 - wall
    return best_offset


def clock_offset_s(samples: int = 7) -> float:
    """``perf_counter() − monotonic()`` here: of ``samples`` bracketed readings, the one with
    the narrowest bracket (the least disturbed), from its midpoint."""
    best_width, best_offset = float("inf"), 0.0
    for _ in range(samples):
        before = time.perf_counter()
        mono = time.monotonic()
        after = time.perf_counter()
        if after - before < best_width:
            best_width, best_offset = after - before, (before + after) / 2 - mono
    return best_offset


def link_clocks(child: Sequence[str] | None = None, timeout_s: float = 30.0) -> ClockLink:
    """Measure this process's offset and check it holds in another process: ``child`` (default:
    this Python running :data:`CHILD_CLOCK`) prints its ``time.monotonic()``, which, converted,
    must fall between ``perf_counter()`` before it started and after it ended; ClockError if not.
    """
    command = list(child) if child is not None else [sys.executable, *CHILD_CLOCK]
    offset = clock_offset_s()
    before = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, check=True)
    after = time.perf_counter()
    link = ClockLink(offset, after - before, wall_offset_s())
    try:
        seen = link.to_perf_counter(float(done.stdout.strip()))
    except ValueError:
        raise ClockError(f"the clock check printed {done.stdout.strip()!r}, not a time") from None
    if not before <= seen <= after:
        raise ClockError(
            f"another process's time.monotonic() is {seen - before:+.6f} s from this process's "
            f"perf_counter() when it ran (window {after - before:.3f} s): the engine's stamps "
            "cannot be put on the run clock"
        )
    return link


@dataclass(frozen=True)
class EngineStamps:
    """One request's life as its engine stamped it, as ``perf_counter()`` readings here (None:
    not stamped). ``received`` is the engine's front end taking the request in (in this process,
    wall clock); ``queued`` is the engine core's scheduler taking it, which happens only between
    steps, so a request that arrives during a step waits for it first, as in Vidur, where a
    request arrives at the replica and waits for the running batch."""

    queued: float | None
    scheduled: float | None
    first_token: float | None
    last_token: float | None
    received: float | None = None

    @property
    def arrival(self) -> float | None:
        """When the engine got the request: ``received`` where stamped, else ``queued``."""
        return self.received if self.received is not None else self.queued


def engine_stamps(metrics: Any, link: ClockLink) -> EngineStamps:
    """vLLM's ``RequestOutput.metrics`` (a ``RequestStateStats``; None without ``log_stats``)
    as :class:`EngineStamps`; vLLM's 0.0 means not stamped."""

    def converted(name: str) -> float | None:
        value = float(getattr(metrics, name, 0.0) or 0.0)
        return link.to_perf_counter(value) if value > 0 else None

    wall = float(getattr(metrics, "arrival_time", 0.0) or 0.0)
    received = (
        link.wall_to_perf_counter(wall)
        if wall > 0 and link.wall_offset_s == link.wall_offset_s
        else None
    )
    return EngineStamps(
        queued=converted("queued_ts"),
        scheduled=converted("scheduled_ts"),
        first_token=converted("first_token_ts"),
        last_token=converted("last_token_ts"),
        received=received,
    )


def out_of_order(
    stamps: EngineStamps, submitted: float, first_seen: float | None, last_seen: float | None
) -> list[str]:
    """What in ``stamps`` contradicts the order of events (all ``perf_counter`` readings): the
    engine queues a request after the client submitted it, schedules it after queueing, stamps
    its tokens after that, and each before the client sees it. Empty when all is in order."""
    chain = [
        ("submitted", submitted),
        ("received", stamps.received),
        ("queued", stamps.queued),
        ("scheduled", stamps.scheduled),
        ("first token", stamps.first_token),
        ("last token", stamps.last_token),
    ]
    known = [(name, t) for name, t in chain if t is not None]
    wrong = [
        f"{b} {tb - ta:+.6f} s after {a}"
        for (a, ta), (b, tb) in itertools.pairwise(known)
        if tb < ta
    ]
    for name, engine, seen in (
        ("first token", stamps.first_token, first_seen),
        ("last token", stamps.last_token, last_seen),
    ):
        if engine is not None and seen is not None and engine > seen:
            wrong.append(f"{name} stamped {engine - seen:.6f} s after the client saw it")
    return wrong
