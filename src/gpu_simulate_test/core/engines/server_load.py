"""Each server's load as a router in front of a fleet scrapes it: a thread reads every server's
``/metrics`` every ``poll_s`` (llm-d's endpoint picker: 50 ms) and keeps the latest
``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc``; each server's KV cache size and
block size once, from ``vllm:cache_config_info``. What :class:`Scraped` hands the client's
``prefix_affinity`` router (:class:`~gpu_simulate_test.core.prefix_affinity.AffinityView`).

The lines are found by their names, not by a full Prometheus parse: the poller runs on the
client's core beside the sends, 20 times a second per server.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from gpu_simulate_test.core.prefix_affinity import chained_blocks

WAITING = "vllm:num_requests_waiting{"
USAGE = "vllm:kv_cache_usage_perc{"
CACHE_INFO = "vllm:cache_config_info{"
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def read_load(text: str) -> tuple[int, float] | None:
    """(waiting requests, KV usage in [0, 1]) from a ``/metrics`` text, summed over its engines;
    None when the server exports neither."""
    waiting, usage, seen = 0.0, 0.0, False
    for line in text.splitlines():
        if line.startswith(WAITING):
            waiting += float(line.rsplit(" ", 1)[1])
            seen = True
        elif line.startswith(USAGE):
            usage = max(usage, float(line.rsplit(" ", 1)[1]))
            seen = True
    return (round(waiting), usage) if seen else None


def read_cache_info(text: str) -> dict[str, str]:
    """The labels of ``vllm:cache_config_info`` (``num_gpu_blocks``, ``block_size``, ...);
    empty when the server does not export it."""
    for line in text.splitlines():
        if line.startswith(CACHE_INFO):
            return dict(_LABEL.findall(line[len(CACHE_INFO) - 1 : line.rindex("}")]))
    return {}


@dataclass
class ServerLoads:
    """The latest scrape of each server at ``urls`` (``base_url``\\ s), polled every ``poll_s``
    on a thread of its own from :meth:`start` to :meth:`stop`."""

    urls: Sequence[str]
    poll_s: float
    fallback_blocks: int
    """A server's KV cache in blocks where it does not say (``cache_config_info``)."""
    loads: list[tuple[int, float]] = field(init=False)
    num_gpu_blocks: list[int] = field(init=False)
    block_size: int | None = field(init=False, default=None)
    scrapes: int = field(init=False, default=0)
    failures: int = field(init=False, default=0)
    _stop: threading.Event = field(init=False, default_factory=threading.Event)
    _thread: threading.Thread | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.loads = [(0, 0.0)] * len(self.urls)
        self.num_gpu_blocks = [self.fallback_blocks] * len(self.urls)

    def start(self) -> None:
        """Read each server's cache size once, then poll until :meth:`stop`."""
        with httpx.Client(timeout=10) as client:
            for k, url in enumerate(self.urls):
                info = read_cache_info(client.get(f"{url}/metrics").text)
                if info.get("num_gpu_blocks", "").isdigit():
                    self.num_gpu_blocks[k] = int(info["num_gpu_blocks"])
                if info.get("block_size", "").isdigit():
                    self.block_size = int(info["block_size"])
        self._thread = threading.Thread(target=self._poll, name="server-loads", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        with httpx.Client(timeout=max(1.0, 10 * self.poll_s)) as client:
            due = time.perf_counter()
            while not self._stop.is_set():
                for k, url in enumerate(self.urls):
                    try:
                        load = read_load(client.get(f"{url}/metrics").text)
                    except httpx.HTTPError:
                        load = None
                    if load is None:
                        self.failures += 1
                    else:
                        self.loads[k] = load
                        self.scrapes += 1
                due += self.poll_s
                self._stop.wait(max(0.0, due - time.perf_counter()))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def describe(self) -> dict[str, object]:
        return {
            "poll_s": self.poll_s,
            "scrapes": self.scrapes,
            "failed_scrapes": self.failures,
            "num_gpu_blocks": list(self.num_gpu_blocks),
            "block_size": self.block_size,
        }


@dataclass(frozen=True)
class Scraped:
    """One request's view for the router: its prompt's blocks and the servers' load as last
    scraped, copied when the request is routed (the poller may write a newer scrape meanwhile;
    the copy is what the router read, :data:`ROUTER_READS`)."""

    blocks: list[int]
    loads: list[tuple[int, float]]
    num_gpu_blocks: list[int]

    @classmethod
    def of(cls, tokens: Sequence[int] | None, block_size: int, servers: ServerLoads) -> Scraped:
        return cls(
            chained_blocks(tokens or (), block_size),
            list(servers.loads),
            list(servers.num_gpu_blocks),
        )

    def prompt_blocks(self, r: int) -> list[int]:
        return self.blocks

    def polled(self, engine: int, now: float) -> tuple[int, float]:
        return self.loads[engine]

    def num_blocks(self, engine: int) -> int:
        return self.num_gpu_blocks[engine]
