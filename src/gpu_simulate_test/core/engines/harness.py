"""The replay: send each request at its scheduled arrival time on a monotonic clock, then wait.

Time 0 is ``time.perf_counter()`` at the first scheduled arrival (plus a short lead so it is
not late). Waits sleep until shortly before the target and then yield in a tight loop, which
keeps the arrival error under a millisecond while an in-process engine thread runs.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from gpu_simulate_test.core.engines.base import Backend, BackendError
from gpu_simulate_test.core.engines.records import (
    STATUS_CANCELLED,
    STATUS_ERROR,
    STATUS_TIMEOUT,
    BenchRequest,
    Recorder,
)

START_LEAD_S = 0.05
"""Time 0 is this far after the replay starts, so the first arrival is on time."""
SPIN_WINDOW_S = 0.002
"""The last stretch before an arrival is waited out by spinning rather than sleeping."""
SPIN_WINDOW_OUT_OF_PROCESS_S = 0.0005
"""The same for a client whose engine runs in another process, on a core it shares with the
server's front end: a long spin makes the client a CPU hog that the OS scheduler then preempts
for whole slices. Against a vLLM server on 2 cores (3 runs each, 40 requests at 4 req/s), the
arrival error p99 was 0.3–0.6 ms spinning 0.5 ms, 2–8 ms spinning 2 ms and 10–60 ms spinning
5 ms."""
POLL_S = 0.05
"""How often the wait for completions checks timeouts, failures and the progress bar."""

ProgressFn = Callable[[Recorder], None]


def spin_window_s(backend: Backend) -> float:
    """How long a client of ``backend`` spins before each send: :data:`SPIN_WINDOW_S` in
    process, :data:`SPIN_WINDOW_OUT_OF_PROCESS_S` against a server (every sender of requests
    waits the same way: the real bench, the closed loop and the calibration replays)."""
    return SPIN_WINDOW_S if backend.in_process else SPIN_WINDOW_OUT_OF_PROCESS_S


def wait_until(target: float, spin_window_s: float = SPIN_WINDOW_S) -> float:
    """Return at ``perf_counter() >= target`` (sleep, then spin the last ``spin_window_s``);
    returns the time it woke."""
    while True:
        now = time.perf_counter()
        remaining = target - now
        if remaining <= 0:
            return now
        if remaining > spin_window_s:
            time.sleep(remaining - spin_window_s)
        else:
            pass  # busy-wait: the GIL is still handed over every switch interval


@contextlib.contextmanager
def switch_interval(seconds: float | None) -> Iterator[None]:
    """Temporarily set Python's thread switch interval (restored on exit)."""
    if seconds is None:
        yield
        return
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds)
    try:
        yield
    finally:
        sys.setswitchinterval(previous)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No cyclic garbage collection while the replay runs: a full collection over a heap holding
    torch and transformers stops every thread for tens of milliseconds, which showed as a 35 ms
    late send. Objects alive at the start are frozen out of later collections; collection
    resumes (and catches up) on exit."""
    was_enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.unfreeze()


def _threads() -> list[int]:
    """This process's thread ids (``/proc/self/task``), or 0 (the calling thread) without it.
    The listing is tried three times: it opens a directory, which a moment short of file
    descriptors fails."""
    for _ in range(3):
        try:
            return [int(tid) for tid in os.listdir("/proc/self/task")]
        except OSError:
            time.sleep(0.01)
    return [0]


_PIN_PASSES = 3


def _pin(cpus: set[int], previous: dict[int, set[int]]) -> bool:
    """One pass: every listed thread not yet held on ``cpus`` is pinned (its earlier mask kept
    once in ``previous``); True when the pass found nothing left to do."""
    settled = True
    for tid in _threads():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            now = os.sched_getaffinity(tid)
            if now == cpus:
                continue
            previous.setdefault(tid, now)
            os.sched_setaffinity(tid, cpus)
            settled = False
    return settled


@contextlib.contextmanager
def cpu_affinity(cpus: set[int] | None) -> Iterator[None]:
    """Keep this process, every thread of it, on ``cpus`` for the block (threads started in it
    inherit it); None leaves it alone. ``sched_setaffinity(0)`` alone pins the calling thread
    only: the sender threads started ahead of time and the log reader floated, and were seen
    queued behind vLLM's worker on the other core while the client's core sat idle. Passes
    repeat (at most three) until one finds every thread held: a thread started by one not yet
    pinned, or a mask reset under us, is caught by the next."""
    if not cpus:
        yield
        return
    previous: dict[int, set[int]] = {}
    for _ in range(_PIN_PASSES):
        if _pin(cpus, previous):
            break
    try:
        yield
    finally:
        for tid, cpus_before in previous.items():
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, cpus_before)


@dataclass(frozen=True)
class ReplayOutcome:
    """How the replay ended (requests are in the recorder)."""

    num_sent: int
    wall_time_s: float


def raise_if_dead(backend: Backend, recorder: Recorder) -> None:
    """BackendError (in-flight requests failed first) when the engine died."""
    why = backend.failure()
    if why is not None:
        for rec in recorder.in_flight():
            recorder.finish(rec.request_id, STATUS_ERROR, f"engine died: {why}")
        raise BackendError(f"{backend.name} died mid-run: {why}")


def expire_overdue(backend: Backend, recorder: Recorder, timeout_s: float) -> None:
    """Close (``timeout``) and cancel every request in flight longer than ``timeout_s``."""
    now = recorder.rel(time.perf_counter())
    for rec in recorder.in_flight():
        assert rec.arrival_s is not None
        if now - rec.arrival_s > timeout_s and recorder.finish(
            rec.request_id, STATUS_TIMEOUT, f"not finished {timeout_s:g} s after arrival"
        ):
            backend.cancel(rec.request_id)


def cancel_in_flight(recorder: Recorder, exc: BaseException) -> None:
    """Close every request in flight as ``cancelled``, saying why the replay stopped (``exc``),
    so that what was measured can be written."""
    reason = "interrupted (Ctrl-C)" if isinstance(exc, KeyboardInterrupt) else f"run stopped: {exc}"
    for rec in recorder.in_flight():
        recorder.finish(rec.request_id, STATUS_CANCELLED, reason)


@dataclass
class Watch:
    """What a replay does while it waits, away from a send: the engine's health, requests past
    their timeout, and the progress callback at most every ``every_s``."""

    backend: Backend
    recorder: Recorder
    request_timeout_s: float
    progress: ProgressFn | None
    every_s: float
    last_progress: float = 0.0

    def check(self) -> None:
        raise_if_dead(self.backend, self.recorder)
        expire_overdue(self.backend, self.recorder, self.request_timeout_s)
        if self.progress is not None and time.perf_counter() - self.last_progress > self.every_s:
            self.progress(self.recorder)
            self.last_progress = time.perf_counter()


def replay(
    backend: Backend,
    requests: Sequence[BenchRequest],
    recorder: Recorder,
    request_timeout_s: float,
    progress: ProgressFn | None = None,
    progress_every_s: float = 0.25,
) -> ReplayOutcome:
    """Submit every request at its arrival time and wait until all are closed.

    Requests must be sorted by ``scheduled_arrival_s``. Raises BackendError when the engine dies;
    on that, on Ctrl-C and on any other exception, in-flight requests are closed (``error`` or
    ``cancelled``) so that what was measured can be written.
    """
    spin = spin_window_s(backend)
    started = time.perf_counter()
    recorder.origin = started + START_LEAD_S
    watch = Watch(backend, recorder, request_timeout_s, progress, progress_every_s)
    sent = 0
    try:
        for req in requests:
            target = recorder.origin + req.scheduled_arrival_s
            # far from the next arrival: check health, timeouts, progress while waiting
            while target - time.perf_counter() > 2 * POLL_S:
                watch.check()
                time.sleep(POLL_S)
            raise_if_dead(backend, recorder)
            wait_until(target, spin)
            backend.submit(req)
            sent += 1
        while recorder.num_done < sent:
            watch.check()
            recorder.wait_for_change(POLL_S)
    except BaseException as exc:
        cancel_in_flight(recorder, exc)
        raise
    finally:
        if progress is not None:
            progress(recorder)
    return ReplayOutcome(num_sent=sent, wall_time_s=time.perf_counter() - started)
