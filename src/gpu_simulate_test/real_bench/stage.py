"""The ``real_bench`` stage: read a workload run, replay it against a backend, write the metrics.

Everything that can be wrong with the input (workload run, prompts, context length, KV-cache
size, endpoint) fails before the run directory is created and before the clock starts.
Whatever happens after, what was measured is written: ``request_metrics.csv``,
``token_metrics.csv``, ``summary.json``, ``telemetry.csv`` (with a GPU) and ``run_meta.json``.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.core.engines import (
    Backend,
    check_serves_sessions,
    get_backend,
    make_backend,
)
from gpu_simulate_test.core.engines.closed_loop import describe_sessions, replay_sessions
from gpu_simulate_test.core.engines.harness import (
    ReplayOutcome,
    cpu_affinity,
    gc_paused,
    replay,
    switch_interval,
)
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder
from gpu_simulate_test.core.engines.warmup import shape_warmup_requests
from gpu_simulate_test.core.host import host_probe
from gpu_simulate_test.core.host.disturbance import Verdict
from gpu_simulate_test.core.metrics.goodput import GoodputConfig
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.core.traffic.requests import check_context, load_requests
from gpu_simulate_test.core.traffic.workloads import LoadedWorkload, load_workload, told_rate
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import write_csv, write_json
from gpu_simulate_test.io.runs import Run, default_run_id, start_run
from gpu_simulate_test.io.schemas import REQUEST_METRICS, TOKEN_METRICS
from gpu_simulate_test.real_bench.checks import ReplayCpu, run_verdict
from gpu_simulate_test.real_bench.contract import SUMMARY, TELEMETRY, TELEMETRY_CSV
from gpu_simulate_test.real_bench.engine_record import (
    check_cached_tokens,
    check_step_log,
    describe,
)
from gpu_simulate_test.real_bench.metrics import request_frame, summarize, token_frame
from gpu_simulate_test.real_bench.report import live_progress, print_summary
from gpu_simulate_test.real_bench.telemetry import TelemetrySampler


def warmup_requests(
    requests: Sequence[BenchRequest], count: int, vocab_size: int, seed: int | None = None
) -> list[BenchRequest]:
    """Warm-up requests shaped like the first ``count`` ones, with fresh random prompts.

    Fresh prompts (a new ``seed`` each run unless one is given) keep a server's prefix cache
    from serving the measured requests, or a later run's warm-up, from an earlier run.
    """
    rng = np.random.default_rng(seed)
    out: list[BenchRequest] = []
    for i, req in enumerate(requests[:count]):
        ids = tuple(
            int(t) for t in rng.integers(0, min(vocab_size, 151643), req.num_prefill_tokens)
        )
        out.append(
            BenchRequest(
                request_id=-(i + 1),
                num_prefill_tokens=req.num_prefill_tokens,
                num_decode_tokens=req.num_decode_tokens,
                scheduled_arrival_s=0.0,
                prompt_token_ids=ids if req.prompt_token_ids is not None else None,
                prompt_text=None if req.prompt_token_ids is not None else "warm up " * 8,
            )
        )
    return out


def write_results(
    run: Run,
    recorder: Recorder,
    telemetry: TelemetrySampler,
    backend_info: Mapping[str, Any],
    summary_extra: Mapping[str, Any],
    goals: GoodputConfig | None = None,
) -> dict[str, Any]:
    """Write the metric tables, telemetry and ``summary.json`` of what the recorder holds."""
    records = recorder.snapshot()
    write_csv(run.file(layout.REQUEST_METRICS), request_frame(records), REQUEST_METRICS)
    write_csv(run.file(layout.TOKEN_METRICS), token_frame(records), TOKEN_METRICS)
    if telemetry.samples:
        write_csv(run.file(TELEMETRY_CSV), telemetry.frame(), TELEMETRY)
    summary = {**summarize(records, goals), **summary_extra}
    write_json(run.file(SUMMARY), summary)
    statuses: dict[str, int] = {}
    for rec in records:
        statuses[rec.status] = statuses.get(rec.status, 0) + 1
    run.update_meta(
        backend=dict(backend_info),
        request_statuses=statuses,
        telemetry={
            "available": telemetry.available,
            "samples": len(telemetry.samples),
            "note": telemetry.note,
        },
        arrival_error_ms=summary["arrival_error_ms"],
        output_throughput_tokens_per_s=summary["output_throughput"],
    )
    return summary


def _summary_extra(
    cfg: RealBenchStageConfig, workload: LoadedWorkload, num_requests: int
) -> dict[str, Any]:
    arrival = workload.meta.get("generator", {}).get("arrival", {})
    return {
        "date": datetime.now(UTC).strftime("%Y%m%d-%H%M%S"),
        "backend": cfg.backend.name,
        "model_id": cfg.model.local_path or cfg.model.hf_name or cfg.model.name,
        "tokenizer_id": cfg.model.local_path or cfg.model.hf_name or cfg.model.name,
        "num_prompts": num_requests,
        "request_rate": told_rate(workload.meta),  # --request-rate: told, not realized
        "burstiness": arrival.get("burstiness"),
        "max_concurrency": None,
        "workload_id": workload.workload_id,
        "metric_conventions": "vllm bench serve: TTFT includes queueing; TPOT excludes the "
        "first token; ITL pools every inter-event gap; times are harness-observed",
    }


@contextlib.contextmanager
def _backend_session(backend: Backend, recorder: Recorder) -> Iterator[dict[str, Any]]:
    """Start the backend; always close it (aborting on error or Ctrl-C). Yields its description."""
    info: dict[str, Any] = {"name": backend.name}
    ok = False
    try:
        backend.start(recorder)
        yield info
        ok = True
    finally:
        info.update(describe(backend))
        backend.close(abort=not ok)


def run(cfg: RealBenchStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """Replay ``cfg.workload_dir`` against ``cfg.backend``; returns the run directory."""
    workload = load_workload(cfg.workload_dir)
    backend_cls = get_backend(cfg.backend.name)
    sessions = workload.sessions
    if sessions is not None:  # a closed loop per session: refused before anything starts
        check_serves_sessions(backend_cls, sessions.num_sessions)
    requests = load_requests(workload, cfg.max_requests, sessions=sessions is not None)
    check_context(requests, cfg.model)
    backend = make_backend(cfg, backend_cls)
    backend.check(requests)
    warmup_seed = int(np.random.SeedSequence().entropy % 2**32)  # type: ignore[operator]
    warmups = warmup_requests(requests, cfg.num_warmup_requests, cfg.model.vocab_size, warmup_seed)
    shapes: list[BenchRequest] = []
    if cfg.backend.warmup_shapes:
        shapes = shape_warmup_requests(
            requests,
            *cfg.backend.step_limits(),
            cfg.model.vocab_size,
            first_id=-(len(warmups) + 1),
            seed=warmup_seed + 1,
        )
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    recorder = Recorder(requests)
    telemetry = TelemetrySampler(cfg.hardware.device, cfg.telemetry_interval_s)
    extra = _summary_extra(cfg, workload, len(requests))
    with start_run(
        cfg.output.root, "real_bench", run_id, resolved_config, cfg.output.overwrite
    ) as r:
        r.update_meta(
            workload_dir=str(cfg.workload_dir),
            workload_id=workload.workload_id,
            num_requests=len(requests),
            num_warmup_requests=len(warmups),
            num_shape_warmups=len(shapes),
            warmup_seed=warmup_seed,
        )
        backend.log_dir = r.path
        session = _Session(info={"name": backend.name})
        try:
            _replay(cfg, backend, recorder, requests, (warmups, shapes), telemetry, r, session)
        finally:
            summary, verdict = _write_what_was_measured(
                cfg, r, backend, recorder, telemetry, session, extra
            )
            if sessions is not None:  # the run was a closed loop: how its sends went
                r.update_meta(sessions=describe_sessions(requests, recorder.snapshot()))
        served_ok = r.meta["request_statuses"].get("ok", 0)
        check_step_log(r.path, r.meta.get("engine_log") or {}, served_ok)
        check_cached_tokens(r.meta.get("engine_log") or {}, served_ok)
    if verdict.disturbed:
        console.print(
            "[bold yellow]disturbed run:[/] " + "; ".join(verdict.reasons) + " (run_meta.json: "
            "disturbance)"
        )
    if cfg.progress:
        print_summary(
            summary, f"real_bench {cfg.backend.name} · {cfg.model.name} · {workload.workload_id}"
        )
        console.print(f"[bold]artifacts:[/] {r.path}")
    return r.path


@dataclass
class _Session:
    """How far a replay got, for the results written whatever happened."""

    info: dict[str, Any]
    """The backend's description (:func:`describe`)."""
    outcome: ReplayOutcome | None = None
    replay_started: float | None = None
    cpu: ReplayCpu | None = None
    probe: dict[str, Any] = field(default_factory=dict)
    """The host's memory speed before and after the replay (where it is read)."""


def _replay(
    cfg: RealBenchStageConfig,
    backend: Backend,
    recorder: Recorder,
    requests: list[BenchRequest],
    warmups: tuple[list[BenchRequest], list[BenchRequest]],
    telemetry: TelemetrySampler,
    r: Run,
    session: _Session,
) -> None:
    """Start the backend, warm it up (``warmups``: the requests shaped like the first ones,
    then the shape warm-up, less the sizes the engine has already run: a server that calibrated
    or served an earlier run of this process paid their one-time costs), then replay
    ``requests`` on the clock (the client on its own cores, the GIL switch interval set, no
    GC), a multi-turn workload's sessions in a closed loop
    (:mod:`~gpu_simulate_test.core.engines.closed_loop`); ``session`` says how far it got."""
    read_host = host_probe.reads_host(cfg.hardware.device, cfg.backend.host_probe)

    def say(line: str) -> None:  # the minute a server takes to start is not left silent
        if cfg.progress:
            console.print(line, highlight=False)

    say(f"starting {backend.name} ({cfg.model.name} on {cfg.hardware.device}) ...")
    began = time.perf_counter()
    with _backend_session(backend, recorder) as info:
        session.info = info
        first, shapes = warmups
        ran = backend.sizes_run()
        cold = [s for s in shapes if s.num_prefill_tokens not in ran]
        r.update_meta(shape_warmups_skipped=len(shapes) - len(cold))
        say(
            f"{backend.name} started in {time.perf_counter() - began:.1f} s; warming up: "
            f"{len(first)} request(s) shaped like the first, {len(cold)} step size(s) "
            f"({len(shapes) - len(cold)} already run) ..."
        )
        began = time.perf_counter()
        backend.warmup(first + cold)
        say(f"warm-up done in {time.perf_counter() - began:.1f} s")
        info.update(describe(backend))
        client_cpus = backend.client_cpus()
        info["client_cpus"] = sorted(client_cpus) if client_cpus else None
        if read_host:  # the host's memory speed before the clock starts
            session.probe["before"] = _read_host(cfg, client_cpus)
        r.update_meta(backend=dict(info))
        telemetry.start()
        interval = cfg.backend.gil_switch_interval_s
        with (
            switch_interval(interval),
            cpu_affinity(client_cpus),
            gc_paused(),
            live_progress(len(requests), cfg.progress) as bar,
        ):
            session.cpu = cpu = ReplayCpu(backend).start()
            session.replay_started = time.perf_counter()
            closed = any(r.session_id is not None for r in requests)
            send = replay_sessions if closed else replay
            session.outcome = send(backend, requests, recorder, cfg.backend.request_timeout_s, bar)
            cpu.stop()  # while a server the backend started still runs
        if read_host:  # and after the last request
            session.probe["after"] = _read_host(cfg, client_cpus)


def _write_what_was_measured(
    cfg: RealBenchStageConfig,
    r: Run,
    backend: Backend,
    recorder: Recorder,
    telemetry: TelemetrySampler,
    session: _Session,
    extra: dict[str, Any],
) -> tuple[dict[str, Any], Verdict]:
    """After the replay, however it ended: the engine's artifacts, the CPU and host readings,
    the disturbance verdict and the metric tables; returns the summary and the verdict."""
    telemetry.stop()
    telemetry_origin_fix(telemetry, recorder)
    if session.outcome is not None:
        r.update_meta(replay_wall_time_s=round(session.outcome.wall_time_s, 3))
    if session.replay_started is not None:
        r.update_meta(
            engine_log=backend.write_artifacts(r.path, recorder.origin, session.replay_started)
        )
    info = session.info
    extra["model_id"] = extra["tokenizer_id"] = info.get("model_id", extra["model_id"])
    cpu = session.cpu
    if cpu is not None:
        cpu.stop()
        r.update_meta(
            cpu_cores_by_process=cpu.own_cores,
            client_run_queue_wait_s=cpu.own.client_run_delay_s,
            steal_cores=round(cpu.foreign.steal_cores, 4),  # recorded, not judged
        )
    cores = cpu.foreign_cores if cpu is not None else None
    if session.probe:
        r.update_meta(host_probe=session.probe)
    verdict = run_verdict(r.path, recorder.snapshot(), cores, "the replay did not start")
    extra["disturbance"] = verdict.to_dict()
    summary = write_results(r, recorder, telemetry, info, extra, cfg.goodput)
    r.update_meta(disturbance=extra["disturbance"])
    return summary, verdict


def _read_host(cfg: RealBenchStageConfig, client_cpus: set[int] | None) -> dict[str, Any]:
    """One host-memory reading on the engine's core
    (:mod:`~gpu_simulate_test.core.host.host_probe`)."""
    return host_probe.read(cfg.model.vocab_size, cfg.model.hidden_size, cfg.dtype, client_cpus)


def telemetry_origin_fix(telemetry: TelemetrySampler, recorder: Recorder) -> None:
    """Express telemetry sample times from the run origin (set once the replay started)."""
    if telemetry.origin == recorder.origin or not math.isfinite(recorder.origin):
        return
    shift = recorder.origin - telemetry.origin
    for sample in telemetry.samples:
        sample["time_s"] -= shift
    telemetry.origin = recorder.origin
