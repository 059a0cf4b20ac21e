"""One served engine for everything an orchestrator asks of it: the engine calibration, the
truth, its repeats, a capacity probe. A vLLM server start costs about a minute on 2 CPU cores,
and one server for a whole campaign keeps every run on the same process.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

from gpu_simulate_test.config.backends import VllmBackendConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.io.runs import Run
from gpu_simulate_test.orchestrate.configs import real_bench_config


def starts_server(cfg: PipelineStageConfig) -> bool:
    """Whether ``cfg``'s backend is a vLLM server the orchestrator starts itself."""
    b = cfg.backend
    return isinstance(b, VllmBackendConfig) and b.server.kind == "vllm"


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
        from gpu_simulate_test.core.workloads import generate

        built, _ = generate(workload, cfg.model)
        if built.sessions is not None:
            check_serves_sessions(backend, built.sessions.num_sessions)


@contextlib.contextmanager
def served(
    cfg: PipelineStageConfig,
    log_dir: Path,
    record_in: Run | None = None,
    workload_dir: Path | str | None = None,
    purpose: str = "the calibration and the real runs",
) -> Iterator[PipelineStageConfig]:
    """For a vLLM server the orchestrator starts: check the backend (on the workload's requests
    when ``workload_dir`` is given), start one server logging into ``log_dir``, record it in
    ``record_in``'s ``run_meta.json`` (``server``), and yield ``cfg`` pointed at it
    (``server.kind=external``, its ``base_url``; ``log_file``, whose step lines every stage
    reads off the live pipe; ``spans_file``, its per-request spans: the engine's clock). The
    server is stopped by pid on the way out, whatever happened. Other backends: ``cfg`` as it
    is (each stage runs its own engine)."""
    if not starts_server(cfg):
        yield cfg
        return
    assert isinstance(cfg.backend, VllmBackendConfig)  # what starts_server checked
    knobs = cfg.backend
    from gpu_simulate_test.core.engines.vllm import VllmBackend
    from gpu_simulate_test.core.requests import load_requests
    from gpu_simulate_test.core.workloads import load_workload

    backend = VllmBackend(real_bench_config(cfg, workload_dir or "(no workload yet)"))
    workload = load_workload(workload_dir) if workload_dir else None
    runs_sessions = workload is not None and workload.sessions is not None
    backend.check(load_requests(workload, sessions=runs_sessions) if workload else [])
    backend.log_dir = log_dir
    if cfg.progress:
        console.print(f"starting one vLLM server for {purpose}")
    try:
        backend.start_server()
        if record_in is not None:
            record_in.update_meta(server=backend.describe())
        yield dataclasses.replace(
            cfg,
            backend=dataclasses.replace(
                knobs,
                base_url=backend.base_url,
                served_model_name=cfg.model.name,
                server=dataclasses.replace(
                    knobs.server,
                    kind="external",
                    log_file=str(backend.log_path),
                    spans_file=str(backend.spans_path) if backend.spans_path else None,
                    steps_file=str(backend.steps_path) if backend.steps_path else None,
                ),
            ),
        )
    finally:
        backend.stop_server()
