"""One served engine for everything an orchestrator asks of it: the engine calibration, the
truth, its repeats, a capacity probe. A vLLM server start costs about a minute on 2 CPU cores,
and one server for a whole campaign keeps every run on the same process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_simulate_test.config.backends import VllmBackendConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.core.engines.base import BackendError
from gpu_simulate_test.core.engines.server import ServerError
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.io.runs import Run
from gpu_simulate_test.orchestrate.configs import real_bench_config

if TYPE_CHECKING:
    from gpu_simulate_test.core.engines.vllm import VllmBackend


def starts_server(cfg: PipelineStageConfig) -> bool:
    """Whether ``cfg``'s backend is a vLLM server the orchestrator starts itself (one: a fleet
    of ``backend.servers`` is started by each real run, and its calibration times one engine
    started for it)."""
    b = cfg.backend
    return isinstance(b, VllmBackendConfig) and b.server.kind == "vllm" and b.servers == 1


def check_sessions_served(cfg: PipelineStageConfig) -> None:
    """Before any stage runs: ValueError, one line naming ``backend.name``, when ``cfg``'s
    workload has multi-turn sessions (``workload.session.enabled``, or a trace with session
    columns) that its backend cannot run (only a vLLM server's client runs the closed loop)."""
    from gpu_simulate_test.core.engines import check_serves_sessions, get_backend

    backend = get_backend(cfg.backend.name)
    if backend.serves_sessions:
        return
    workload = cfg.workload
    if workload.session.enabled:
        check_serves_sessions(backend, workload.num_requests)
    elif workload.source == "trace":  # sessions come from the trace's columns: read it
        from gpu_simulate_test.core.traffic.workloads import generate

        built, _ = generate(workload, cfg.model)
        if built.sessions is not None:
            check_serves_sessions(backend, built.sessions.num_sessions)


def checked_backend(cfg: PipelineStageConfig, workload_dir: Path | str | None) -> VllmBackend:
    """``cfg``'s vLLM server backend, checked (on the workload's requests when ``workload_dir``
    is given) before anything starts."""
    from gpu_simulate_test.core.engines.vllm import VllmBackend
    from gpu_simulate_test.core.traffic.requests import load_requests
    from gpu_simulate_test.core.traffic.workloads import load_workload

    backend = VllmBackend(real_bench_config(cfg, workload_dir or "(no workload yet)"))
    workload = load_workload(workload_dir) if workload_dir else None
    runs_sessions = workload is not None and workload.sessions is not None
    backend.check(load_requests(workload, sessions=runs_sessions) if workload else [])
    return backend


class EarlyServer:
    """A vLLM server started ahead of its turn, in a thread of its own, so that its start (about
    half a minute on 2 CPU cores, three Python processes importing vLLM) overlaps other work:
    the tune starts the configured backend's while it simulates the space, where no measurement
    runs. :func:`served` adopts it (``early=``) instead of starting one; :meth:`stop` stops it
    whatever state it is in."""

    def __init__(self, cfg: PipelineStageConfig, log_dir: Path, workload_dir: Path) -> None:
        self.cfg = cfg
        self.workload_dir = workload_dir
        self.backend = checked_backend(cfg, workload_dir)
        self.backend.log_dir = log_dir
        self.error: BaseException | None = None
        self.started = time.perf_counter()
        self.ready_s: float | None = None
        """Seconds from the start to ``/health``; None until then (or on a failed start)."""
        self.paused = False
        self._thread = threading.Thread(target=self._start, name="early-server", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            self.backend.start_server()
            self.ready_s = time.perf_counter() - self.started
        except BaseException as exc:  # raised in the caller's thread by join()
            self.error = exc

    def wait(self) -> None:
        """Until the server answers ``/health`` or its start failed (:meth:`join` raises it)."""
        self._thread.join()

    def join(self) -> VllmBackend:
        """The server once it answers ``/health`` (thawed, if it was paused); its start's error,
        raised here."""
        self._thread.join()
        if self.error is not None:
            raise self.error
        self.resume()
        return self.backend

    def pause(self) -> None:
        """Freeze the server while another is measured (SIGSTOP: no CPU at all until
        :meth:`resume`); only one that is up."""
        if self.ready_s is not None and self.backend.server is not None:
            self.backend.server.pause()
            self.paused = True

    def resume(self) -> None:
        """Thaw a paused server and wait until it answers ``/health`` again;
        :class:`BackendError` when it does not (as a start that fails raises it)."""
        if self.paused and self.backend.server is not None:
            self.backend.server.resume()
            self.paused = False
            try:
                self.backend.server.wait_healthy(
                    f"{self.backend.base_url}/health", self.backend.knobs.server.startup_timeout_s
                )
            except ServerError as exc:
                raise BackendError(f"the paused server did not answer again: {exc}") from None

    def stop(self) -> None:
        """Stop the server, up or still starting (its start then fails on its own)."""
        self.backend.stop_server()
        self._thread.join(timeout=STOP_JOIN_S)
        self.backend.stop_server()  # one the thread launched after the first stop


STOP_JOIN_S = 30.0
"""How long :meth:`EarlyServer.stop` waits for a start in flight to notice its server stopped."""


@contextlib.contextmanager
def served(
    cfg: PipelineStageConfig,
    log_dir: Path,
    record_in: Run | None = None,
    workload_dir: Path | str | None = None,
    purpose: str = "the calibration and the real runs",
    early: EarlyServer | None = None,
) -> Iterator[PipelineStageConfig]:
    """For a vLLM server the orchestrator starts: check the backend (on the workload's requests
    when ``workload_dir`` is given), start one server logging into ``log_dir``, record it in
    ``record_in``'s ``run_meta.json`` (``server``), and yield ``cfg`` pointed at it
    (``server.kind=external``, its ``base_url``; ``log_file``, whose step lines every stage
    reads off the live pipe; ``spans_file``, its per-request spans: the engine's clock). The
    server is stopped by pid on the way out, whatever happened. ``early``: a server started
    ahead for this same ``cfg`` (:class:`EarlyServer`), adopted instead of a new one. Other
    backends: ``cfg`` as it is (each stage runs its own engine)."""
    if not starts_server(cfg):
        yield cfg
        return
    assert isinstance(cfg.backend, VllmBackendConfig)  # what starts_server checked
    knobs = cfg.backend
    if early is None:
        backend = checked_backend(cfg, workload_dir)
        backend.log_dir = log_dir
        if cfg.progress:
            console.print(f"starting one vLLM server for {purpose}")
    else:
        backend = early.backend
    try:
        if early is None:
            backend.start_server()
        else:
            early.join()
        if record_in is not None:
            record_in.update_meta(server=backend.describe())
        yield dataclasses.replace(cfg, backend=backend.attached(knobs))
    finally:
        backend.stop_server()
