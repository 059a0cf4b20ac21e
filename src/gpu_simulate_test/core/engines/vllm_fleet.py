"""``vllm`` with ``backend.servers=N``: a fleet of N vLLM servers, one engine each, behind the
client's own router (``backend.router``: round robin, least outstanding, random; the same code
as the simulator's routers of those names, :mod:`gpu_simulate_test.core.routing`).

Each server is the ``vllm`` backend's (:class:`~.vllm.VllmBackend`): started here on a free
port, on CPU bound to its own cores (``VLLM_CPU_OMP_THREADS_BIND``: the cores split as vLLM
splits them among data-parallel ranks), on CUDA its own GPU (``CUDA_VISIBLE_DEVICES``); the
servers start side by side, a few seconds apart. Then the client speaks to each as to a server
it did not start (``server.kind=external``, its log, spans and step record named), exactly as
the pipeline shares one server between its runs.

Every request is routed when it is sent, and its engine recorded (the ``engine`` column of the
request tables). Each server's step log and scheduler record are written in ``engine<k>/`` of
the run and merged into the run's own tables, their ``engine`` column the server's index: the
tables of a ``--data-parallel-size`` run, which ``compare`` and the simulated fleet read alike.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd

from gpu_simulate_test.config.backends import VllmBackendConfig, as_engine
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.core.engines.base import Backend, BackendError
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder
from gpu_simulate_test.core.engines.router_reads import RouterRead, write_router_reads
from gpu_simulate_test.core.engines.server_load import Scraped, ServerLoads
from gpu_simulate_test.core.engines.vllm import SERVER_METRICS, VllmBackend
from gpu_simulate_test.core.engines.vllm_knobs import cpu_threads_bind
from gpu_simulate_test.core.routing import CLIENT_ROUTERS, ROUTER_SEED, ClientRouter
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import write_csv, write_json
from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE, ENGINE_STEP_LOG

ENGINE_DIR = "engine{k}"
"""Each server's own files in the run: its log, spans, step record and tables."""
START_STAGGER_S = 5.0
"""Seconds between two servers' launches: vLLM on CPU imports each server's worker on the
engine's core, so servers launched at once import one after another there."""


def server_binds(b: VllmBackendConfig, num_cpus: int | None = None) -> list[str]:
    """Each server's ``cpu_threads_bind``: ``auto`` splits this machine's cores among the
    servers as vLLM splits them among data-parallel ranks (``0|1`` on 2 cores); a setting with
    one group per server (``"0|1"``) gives each its own; any other is every server's."""
    if b.cpu_threads_bind == "auto":
        return cpu_threads_bind("auto", num_cpus, ranks=b.servers).split("|")
    groups = b.cpu_threads_bind.split("|")
    return groups if len(groups) == b.servers else [b.cpu_threads_bind] * b.servers


def server_gpu(k: int) -> str:
    """Server ``k``'s GPU: the ``k``-th of ``CUDA_VISIBLE_DEVICES`` where it is set (wrapping
    round when there are fewer GPUs than servers), else GPU ``k``."""
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return visible[k % len(visible)].strip() if visible else str(k)


class VllmFleetBackend(Backend):
    """N ``vllm`` servers, one engine each, behind the client's router."""

    name: ClassVar[str] = "vllm"
    in_process: ClassVar[bool] = False
    api_server: ClassVar[bool] = True

    def __init__(self, cfg: RealBenchStageConfig) -> None:
        super().__init__(cfg)
        b = as_engine(cfg.backend, VllmBackendConfig)
        self.count = b.servers
        self.binds = server_binds(b) if not cfg.hardware.device.startswith("cuda") else []
        self.starters = [VllmBackend(self.server_config(k)) for k in range(self.count)]
        if cfg.hardware.device.startswith("cuda"):
            for k, starter in enumerate(self.starters):
                starter.device_env = {"CUDA_VISIBLE_DEVICES": server_gpu(k)}
        self.members: list[VllmBackend] = []
        self.router: ClientRouter = CLIENT_ROUTERS[b.router](self.count, ROUTER_SEED)
        self.routed: dict[int, int] = {}
        self.outstanding: set[int] = set()
        self.loads: ServerLoads | None = None
        """Each server's scraped load, for a router that reads it (``prefix_affinity``)."""
        self.reads: dict[int, RouterRead] = {}
        """Per request routed on scraped load: its server and the loads the router read."""
        self.recorder: Recorder | None = None
        self._lock = threading.Lock()
        self._closed = False

    def server_config(self, k: int) -> RealBenchStageConfig:
        """Server ``k``'s config: one engine, its own cores (CPU) or GPU (CUDA), a free port."""
        b = as_engine(self.cfg.backend, VllmBackendConfig)
        one = dataclasses.replace(b, servers=1, server=dataclasses.replace(b.server, port=0))
        if self.binds:
            one = dataclasses.replace(one, cpu_threads_bind=self.binds[k])
        return dataclasses.replace(self.cfg, backend=one)

    # ------------------------------------------------------------------ checks and start-up
    def check(self, requests: Sequence[BenchRequest]) -> None:
        if any(r.closed_loop for r in requests):
            raise ValueError(
                f"backend.servers={self.count}: a multi-turn workload's sessions run on one "
                "server (its client builds each next prompt from that server's answer)"
            )
        for starter in self.starters:
            starter.check(requests)

    def start(self, recorder: Recorder) -> None:
        """Start the servers side by side (:data:`START_STAGGER_S` apart), then connect to
        each; :class:`BackendError` naming the server that did not come up."""
        self.recorder = recorder
        root = self.log_dir or Path(tempfile.mkdtemp(prefix="vllm-fleet-"))
        errors: list[BaseException | None] = [None] * self.count

        def launch(k: int) -> None:
            try:
                self.starters[k].start_server()
            except BaseException as exc:  # raised below, in the caller's thread
                errors[k] = exc

        threads = []
        for k, starter in enumerate(self.starters):
            starter.log_dir = root / ENGINE_DIR.format(k=k)
            starter.log_dir.mkdir(parents=True, exist_ok=True)
            if k:
                time.sleep(START_STAGGER_S)
            threads.append(threading.Thread(target=launch, args=(k,), name=f"server-{k}"))
            threads[-1].start()
        for thread in threads:
            thread.join()
        failed = [(k, e) for k, e in enumerate(errors) if e is not None]
        if failed:
            k, exc = failed[0]
            raise BackendError(f"server {k} of {self.count} did not start: {exc}")
        for k, starter in enumerate(self.starters):
            self.members.append(self.attach(k, starter, recorder))
        if getattr(self.router, "scrapes", False):
            b = as_engine(self.cfg.backend, VllmBackendConfig)
            urls = [s.base_url for s in self.starters]
            self.loads = ServerLoads(urls, b.router_poll_s, b.num_gpu_blocks_override)
            self.loads.start()

    def attach(self, k: int, starter: VllmBackend, recorder: Recorder) -> VllmBackend:
        """The client of server ``k`` (started by ``starter``), recording into ``recorder`` the
        requests routed to it."""
        member = VllmBackend(self.attached_config(k, starter))
        member.log_dir = starter.log_dir
        member.serves = partial(self.routed_to, k)
        member.start(recorder)
        return member

    def attached_config(self, k: int, starter: VllmBackend) -> RealBenchStageConfig:
        """The client's config for server ``k``, started by ``starter``: a server it did not
        start (``server.kind=external``), its log, spans and step record named."""
        cfg = self.server_config(k)
        attached = starter.attached(as_engine(cfg.backend, VllmBackendConfig))
        return dataclasses.replace(cfg, backend=attached)

    def routed_to(self, k: int, request_id: int) -> bool:
        return self.routed.get(request_id) == k

    def warmup(self, requests: Sequence[BenchRequest]) -> None:
        for member in self.members:
            member.warmup(requests)

    # ------------------------------------------------------------------ requests
    def submit(self, request: BenchRequest) -> None:
        """Route the request (the router told first of every request finished since the last
        one), record its engine, and hand it to that server's client."""
        assert self.recorder is not None
        view = None
        if self.loads is not None:
            block_size = (
                self.loads.block_size or as_engine(self.cfg.backend, VllmBackendConfig).block_size
            )
            view = Scraped.of(request.prompt_token_ids, block_size, self.loads)
        now = time.perf_counter()
        with self._lock:
            self.release_finished(now)
            k = self.router.route(request.request_id, now, view)
            self.routed[request.request_id] = k
            self.outstanding.add(request.request_id)
        if view is not None:
            self.reads[request.request_id] = RouterRead(self.recorder.rel(now), k, view.loads)
        self.recorder.engine_times(request.request_id, engine=k)
        self.members[k].submit(request)

    def release_finished(self, now: float) -> None:
        """Tell the router of the requests it routed that have finished (their last output
        arrived, or they failed)."""
        assert self.recorder is not None
        for rid in [r for r in self.outstanding if self.recorder.record(r).is_done]:
            self.outstanding.discard(rid)
            self.router.finished(rid, self.routed[rid], now)

    def cancel(self, request_id: int) -> None:
        k = self.routed.get(request_id)
        if k is not None:
            self.members[k].cancel(request_id)

    def failure(self) -> str | None:
        for k, backend in [*enumerate(self.members), *enumerate(self.starters)]:
            why = backend.failure()
            if why is not None:
                return f"server {k}: {why}"
        return None

    def client_cpus(self) -> set[int] | None:
        return None  # the servers hold every core between them: the client goes where it can

    def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if self.loads is not None:
            self.loads.stop()
        try:
            for member in self.members:
                member.close(abort)
        finally:
            for starter in self.starters:
                starter.stop_server()

    # ------------------------------------------------------------------ results
    def write_artifacts(self, run_dir: Path, origin: float, since: float) -> dict[str, Any]:
        """Each server's tables in ``engine<k>/``, and merged into the run's own (the
        ``engine`` column the server's index); the servers' counters summed."""
        per_server: list[dict[str, Any]] = []
        for k, member in enumerate(self.members):
            folder = run_dir / ENGINE_DIR.format(k=k)
            folder.mkdir(parents=True, exist_ok=True)
            per_server.append(member.write_artifacts(folder, origin, since))
        for name, schema in (
            (layout.ENGINE_STEP_LOG, ENGINE_STEP_LOG),
            (layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE),
        ):
            merged = merged_tables(run_dir, name, self.count)
            if merged is not None:
                write_csv(run_dir / name, merged, schema)
        deltas = [
            _read_json(run_dir / ENGINE_DIR.format(k=k) / SERVER_METRICS) for k in range(self.count)
        ]
        write_json(run_dir / SERVER_METRICS, {"servers": deltas})
        if self.reads:
            write_router_reads(run_dir, self.reads)
        return fleet_record(per_server)

    def describe(self) -> dict[str, Any]:
        b = as_engine(self.cfg.backend, VllmBackendConfig)
        info: dict[str, Any] = self.members[0].describe() if self.members else {"name": self.name}
        info.update(
            servers=self.count,
            router=b.router,
            router_seed=ROUTER_SEED,
            router_scrapes=None if self.loads is None else self.loads.describe(),
            fleet_servers=[
                {
                    "engine": k,
                    "base_url": s.base_url,
                    "cpu_threads_bind": self.binds[k] if self.binds else None,
                    "server_log": str(s.log_path) if s.log_path else None,
                    "server_pid": s.server.pid if s.server is not None else None,
                }
                for k, s in enumerate(self.starters)
            ],
        )
        return info


SUMMED = (
    "engine_steps",
    "unreadable_step_lines",
    "prefix_cache_hit_tokens",
    "prefix_cache_query_tokens",
    "preemptions",
)
"""Counts of ``run_meta.json`` ``engine_log`` that add up over the servers."""
CLOCK_SUMMED = ("requests", "steps", "preemptions", "otlp_requests", "requests_without_span")


def fleet_record(per_server: list[dict[str, Any]]) -> dict[str, Any]:
    """``run_meta.json`` ``engine_log`` of the fleet: the first server's, its counts summed over
    the servers (the engine clock's too, ``engines`` the servers), the hit rate recomputed from
    the summed counts, each server's own under ``servers``."""
    if not per_server:
        return {}
    out = dict(per_server[0])
    for key in SUMMED:
        values = [s.get(key) for s in per_server]
        out[key] = None if all(v is None for v in values) else sum(int(v or 0) for v in values)
    hits, queries = out.get("prefix_cache_hit_tokens"), out.get("prefix_cache_query_tokens")
    if queries:
        out["prefix_cache_hit_rate"] = (hits or 0) / queries
    clock = dict(out.get("engine_clock") or {})
    for key in CLOCK_SUMMED:
        if key in clock:
            clock[key] = sum(int((s.get("engine_clock") or {}).get(key) or 0) for s in per_server)
    out["engine_clock"] = {**clock, "engines": len(per_server)}
    out["servers"] = per_server
    return out


def merged_tables(run_dir: Path, name: str, count: int) -> pd.DataFrame | None:
    """The servers' ``name`` tables (``engine<k>/<name>``) as one, as a data-parallel server's
    are: an ``engine`` column first (the server's index), each engine's steps numbered as its
    server numbered them, ordered by start time, then engine; None when no server wrote one."""
    frames = []
    for k in range(count):
        path = run_dir / ENGINE_DIR.format(k=k) / name
        if path.is_file():
            frame = pd.read_csv(path)
            frame.insert(0, "engine", k)
            frames.append(frame)
    if not frames:
        return None
    merged = pd.concat(frames, ignore_index=True)
    order = [c for c in ("start_time_s", "time_s") if c in merged.columns][:1]
    return merged.sort_values([*order, "engine"], kind="stable", ignore_index=True)


def _read_json(path: Path) -> Any:
    import json

    return json.loads(path.read_text()) if path.is_file() else None
