"""One asyncio event loop on one thread for every stream of a run: the lean client.

The thread-per-request client (:class:`~gpu_simulate_test.core.engines.openai.SenderPool`) keeps
one Python thread per request in flight, each blocked on its socket; every streamed token wakes
one of them, and they all take turns at the GIL with the replay thread that must send the next
request on time. Here a single loop owns every connection: ``submit`` is one
``call_soon_threadsafe``, each request is a task, and a token is stamped when the loop reads it.
This is how ``vllm bench serve`` drives a server (one asyncio loop, aiohttp).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class StreamLoop:
    """An event loop running on a daemon thread; coroutines are handed to it from any thread."""

    def __init__(self, name: str = "stream-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = False

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def start(self) -> StreamLoop:
        if not self._started:
            self._started = True
            self._thread.start()
        return self

    def call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        """Run ``coro`` on the loop and wait for its result here (set-up and tear-down)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def submit(self, make: Callable[[], Awaitable[Any]]) -> None:
        """Start ``make()`` as a task on the loop and return at once (no thread is started)."""
        self.loop.call_soon_threadsafe(self._spawn, make)

    def _spawn(self, make: Callable[[], Awaitable[Any]]) -> None:
        task = asyncio.ensure_future(make())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def stop(self, timeout_s: float = 10.0) -> None:
        """Cancel what is still running, stop the loop and wait for its thread; idempotent."""
        if not self._started or self.loop.is_closed():
            return

        async def cancel_all() -> None:
            tasks = [t for t in self._tasks if not t.done()]
            for task in tasks:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)

        if self._thread.is_alive():
            with contextlib.suppress(TimeoutError, RuntimeError):  # stopped below anyway
                self.call(cancel_all(), timeout_s)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self.loop.close()
