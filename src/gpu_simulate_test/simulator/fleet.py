"""A fleet: ``N`` engines (:class:`~.engine.VllmV1Engine`, one GPU each) on one clock behind a
router (:mod:`.routers`), request for request (:func:`run_fleet`).

Every dense Qwen3 fits one GPU, so a deployment grows by replicas: ``vllm serve
--data-parallel-size N`` (vLLM's own balancer, ``vllm_dp``) or ``N`` servers behind a router.
Each engine has its own KV cache, queue and step clock (its own draws); the requests' state is
one :class:`~.engine.RequestBook`. Events are taken in time order: a request sent at ``t`` is
routed before any step scheduled at or after ``t`` (an engine queues what reached it by a step's
scheduling), a step's outputs are published when it ends (what ``vllm_dp`` reads, as stale as
vLLM's coordinator makes it) and a finished request is told to the router at its last token.
A closed loop's follower is sent to the router, not to its predecessor's engine.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from gpu_simulate_test.simulator.engine import VllmV1Engine
from gpu_simulate_test.simulator.kv_cache import Segments
from gpu_simulate_test.simulator.routers.base import Router
from gpu_simulate_test.simulator.run import Requests, V1Result, schedule_frame
from gpu_simulate_test.simulator.types import ENGINE, StepClock, V1Params


@dataclass
class FleetResult:
    requests: pd.DataFrame
    """Vidur's per-request rows (as :func:`~.run.run_v1`'s) with the engine of each."""
    schedule: pd.DataFrame
    """Every engine's steps (the ``engine_schedule`` table with the engine column), in the order
    they were scheduled (by start time; at one instant, by engine)."""
    preemptions: list[int]
    """Per engine."""
    prefix_cache: list[dict[str, int]] | None = None
    """Per engine, with prefix caching: vLLM's ``PrefixCacheStats`` totals."""

    def as_v1(self) -> V1Result:
        """One result as one engine's (:class:`~.run.V1Result`): the tables with their engine
        column, the preemptions and prefix-cache totals summed over the engines."""
        cache = None
        if self.prefix_cache is not None:
            cache = {k: sum(s.get(k, 0) for s in self.prefix_cache) for k in self.prefix_cache[0]}
        return V1Result(self.requests, self.schedule, sum(self.preemptions), cache)


class _Published:
    """Each engine's (waiting, running, KV usage) as it published them, by the end of the step
    that changed its counts."""

    def __init__(
        self, engines: list[VllmV1Engine], work: Requests, every_step: bool = False
    ) -> None:
        self._engines = engines
        self._every_step = every_step
        """Record every step's state, changed or not (what a router that scrapes the engines'
        gauges reads: their KV usage moves with every decode step)."""
        self._keys = work.keys
        self._prompt = work.book.prompt
        self._block_size = work.params.block_size
        self.times: list[list[float]] = [[] for _ in engines]
        self.counts: list[list[tuple[int, int, float]]] = [[] for _ in engines]

    @property
    def engines(self) -> list[VllmV1Engine]:
        return self._engines

    def record(self, k: int) -> None:
        """Engine ``k`` after the step (or stretch of decode steps) it just took: as vLLM's
        ``DPEngineCoreProc._maybe_publish_request_counts``, its (waiting, running) counts are
        published when they changed since its last publication, with the KV usage of that
        moment (a stretch changes no count before its last step, so it publishes as its steps
        one by one would)."""
        engine = self._engines[k]
        waiting, running = len(engine.waiting), len(engine.running)
        mine = self.counts[k]
        if self._every_step or not mine or mine[-1][0] != waiting or mine[-1][1] != running:
            self.times[k].append(engine.ready)
            mine.append((waiting, running, engine.kv_usage()))

    def published(self, engine: int, at: float) -> tuple[int, int, float]:
        i = bisect_right(self.times[engine], at)
        return self.counts[engine][i - 1] if i else (0, 0, 0.0)

    def prompt_blocks(self, r: int) -> list[int]:
        if self._keys is None:
            return []
        return self._keys[r][: self._prompt[r] // self._block_size]


def run_fleet(
    params: V1Params,
    clocks: Sequence[StepClock],
    router: Router,
    arrived_at: np.ndarray,
    prefill_tokens: np.ndarray,
    decode_tokens: np.ndarray,
    *,
    segments: Sequence[Segments] | None = None,
    after: Sequence[tuple[int, float]] | None = None,
    log_steps: bool = True,
    routed_at: np.ndarray | None = None,
) -> FleetResult:
    """Simulate requests on ``len(clocks)`` engines of ``params`` behind ``router`` (the
    arguments as :func:`~.run.run_v1`'s; one clock per engine).

    ``routed_at``: per request, when the router decides, at or before it reaches its engine at
    ``arrived_at`` (a real server's API process routes a request before its engine queues it;
    an oracle replay knows both). None: at ``arrived_at``."""
    work = Requests.of(params, arrived_at, prefill_tokens, decode_tokens, segments, after)
    book = work.book
    if routed_at is not None:
        decide = np.minimum(np.asarray(routed_at, dtype=float), book.arr)
        sends = sorted((float(decide[r]), r) for r in work.order if not math.isnan(decide[r]))
    else:
        sends = [(book.arr[r], r) for r in work.order]
        sends = [s for s in sends if not math.isnan(s[0])]  # sorted: the order is by arrival

    def follow(r: int, at: float) -> None:
        heapq.heappush(sends, (at, r))

    engines = [
        VllmV1Engine(
            params, book, work.cache(), clock, after=work.follows, follow=follow,
            log_steps=log_steps,
        )
        for clock in clocks
    ]  # fmt: skip
    for engine in engines:
        engine.done_log = []
    view = _Published(engines, work, every_step=getattr(router, "scrapes", False))
    engine_of = np.full(len(book.prompt), -1, dtype=np.int64)
    finishes: list[tuple[float, int]] = []
    starts = [engine.next_start() for engine in engines]
    """Each engine's next step start, asked again when it steps or is sent a request."""
    start_of, indices = starts.__getitem__, range(len(engines))
    # stretches of decode steps, cut at the next send, where nothing reads an engine between
    # its steps: not a router that reads the engines live, not a closed loop (a finish on one
    # engine sends a follower that another engine's stretch could run past)
    one_at_a_time = router.reads_live or work.follows is not None
    while True:
        due = min(indices, key=start_of)
        start = starts[due]
        if sends and sends[0][0] <= start:
            at, r = heapq.heappop(sends)
            while finishes and finishes[0][0] <= at:
                done_at, done = heapq.heappop(finishes)
                router.finished(done, int(engine_of[done]), done_at)
            k = router.route(r, at, view)
            engine_of[r] = k
            engines[k].add(r, max(at, book.arr[r]))
            starts[k] = engines[k].next_start()
        elif start < math.inf:
            engine = engines[due]
            if one_at_a_time:
                engine.step()
            else:
                engine.take(sends[0][0] if sends else math.inf)
            starts[due] = engine.next_start()
            view.record(due)
            assert engine.done_log is not None
            for r in engine.done_log:
                heapq.heappush(finishes, (book.done[r], r))
            engine.done_log.clear()
        else:
            break
    requests = work.rows()
    requests[ENGINE] = engine_of
    schedules = []
    for k, engine in enumerate(engines):
        frame = schedule_frame(engine.rows)
        frame.insert(0, ENGINE, np.full(len(frame), k, dtype=np.int64))
        schedules.append(frame)
    return FleetResult(
        requests=requests,
        schedule=pd.concat(schedules, ignore_index=True)
        .sort_values(["start_time_s", ENGINE], kind="stable")
        .reset_index(drop=True),
        preemptions=[e.preemptions for e in engines],
        prefix_cache=[dict(e.stats) for e in engines] if params.enable_prefix_caching else None,
    )
