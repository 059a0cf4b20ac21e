"""The lean client's event loop: tasks handed over from another thread run there, concurrently,
and stopping cancels what is left."""

from __future__ import annotations

import asyncio
import functools
import threading
import time

from gpu_simulate_test.core.engines.stream_loop import StreamLoop


def test_submitted_tasks_run_concurrently_on_the_loops_thread() -> None:
    loop = StreamLoop().start()
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    async def request(i: int) -> None:
        await asyncio.sleep(0.2)  # every request waits at once: 10 of them take ~0.2 s, not 2
        seen.append((i, threading.current_thread().name))
        if len(seen) == 10:
            done.set()

    started = time.perf_counter()
    for i in range(10):
        loop.submit(functools.partial(request, i))
    assert done.wait(5.0)
    assert time.perf_counter() - started < 1.5
    assert {name for _, name in seen} == {"stream-loop"}  # no thread per request
    loop.stop()


def test_stop_cancels_what_is_still_running() -> None:
    loop = StreamLoop().start()
    cancelled = threading.Event()

    async def endless() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    loop.submit(endless)
    time.sleep(0.1)
    loop.stop(timeout_s=5.0)
    assert cancelled.is_set() and loop.loop.is_closed()
    loop.stop()  # idempotent
