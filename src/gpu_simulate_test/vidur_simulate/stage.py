"""The ``vidur_simulate`` stage: replay a workload run in Vidur with a local profiling bundle.

Order of work: read and check every input (workload, bundle, coverage, KV cache) without
importing Vidur; create the run; write the trace; build fresh Vidur configs; reset Vidur's entity
ids and seeds; build the simulator (trains or loads the predictor) and run it; check the replay
and write ``request_metrics.csv`` in the real bench's schema next to Vidur's raw output.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.frontend_queue import request_delays_s
from gpu_simulate_test.calibration.record import CalibrationRecord
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.vidur import VidurSimulateStageConfig
from gpu_simulate_test.core.bundle import load_bundle
from gpu_simulate_test.core.reporting import console, print_table
from gpu_simulate_test.core.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import atomic_open, write_csv
from gpu_simulate_test.io.runs import default_run_id, start_run
from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE, ENGINE_STEP_LOG, REQUEST_METRICS
from gpu_simulate_test.simulator.types import CACHED_TOKENS as V1_CACHED_TOKENS
from gpu_simulate_test.simulator.types import ENGINE_QUEUED as V1_ENGINE_QUEUED
from gpu_simulate_test.simulator.types import NAME as V1_NAME
from gpu_simulate_test.vidur_simulate import metrics as vidur_metrics
from gpu_simulate_test.vidur_simulate import plan
from gpu_simulate_test.vidur_simulate.contract import (
    ENGINE_OVERHEAD_FIT,
    TRACE_FILE,
    VIDUR_DIR,
    VIDUR_REQUEST_METRICS,
)
from gpu_simulate_test.vidur_simulate.inputs import Inputs, running_at_send
from gpu_simulate_test.vidur_simulate.prompt_origins import (
    known_arrivals,
    prefix_cache_meta,
    prompt_segments,
    session_loop,
    simulated_sends,
)
from gpu_simulate_test.vidur_simulate.real_run import (
    actual_arrivals,
    recorded_config,
    with_run_knobs,
)
from gpu_simulate_test.vidur_simulate.replay import (
    replay_source,
    schedule_with_ids,
    v1_params,
)
from gpu_simulate_test.vidur_simulate.serving_report import serving_report
from gpu_simulate_test.vidur_simulate.simulation import simulate
from gpu_simulate_test.vidur_simulate.simulator import SimulationRequest, SimulationResult


def prepare(cfg: VidurSimulateStageConfig) -> Inputs:
    """Read the workload and bundle and run every check; raises before any long work."""
    if cfg.vidur.step_jitter and cfg.vidur.engine_overhead == "none":
        raise ConfigError(
            "vidur.step_jitter=true needs vidur.engine_overhead=<backend>: the spread is "
            "measured by that backend's engine calibration"
        )
    workload = load_workload(cfg.workload_dir)
    prefill, decode = plan.workload_lengths(workload.lengths)
    arrival = workload.intervals["arrival_time_s"].to_numpy(dtype=float)
    if cfg.arrivals_from:
        arrival = actual_arrivals(cfg.arrivals_from, workload, arrival)
    replay = None
    if cfg.step_times_from:
        replay = replay_source(cfg.step_times_from, workload, arrival)
        arrival = replay.client_arrival_s
    plan.check_context(prefill, decode, cfg.model, str(workload.path))
    bundle = load_bundle(
        layout.bundle_dir(cfg.profiling_root, cfg.hardware.name, cfg.model.name), cfg.model
    )
    knobs = cfg.vidur.scheduler
    needs = plan.requirements(prefill, decode, knobs)
    kv_cache = plan.kv_cache_plan(
        cfg.model, cfg.hardware, knobs, plan.resolve_dtype(bundle, cfg.hardware)
    )
    plan.check_scheduler(needs, knobs, bundle, kv_cache.num_blocks)
    plan.check_coverage(needs, bundle)
    backend = cfg.vidur.engine_overhead
    record = CalibrationRecord.load(bundle, backend) if backend != "none" else None
    engine_steps = record.steps if record is not None else None
    jitter = record.require_step_jitter() if record is not None and cfg.vidur.step_jitter else None
    frontend = (
        record.frontend
        if record is not None and cfg.vidur.frontend_latency and replay is None
        else None
    )
    after = session_loop(workload.sessions, knobs.name, frontend, replay is not None)
    queue = None
    if frontend is not None and cfg.vidur.frontend_queue and cfg.vidur.scheduler.name == V1_NAME:
        queue = record.frontend_queue if record is not None and cfg.vidur.step_log else None
    serving = None
    if record is not None and cfg.vidur.serving_load and cfg.vidur.scheduler.name == V1_NAME:
        serving = record.serving_steps
    return Inputs(
        calibration=record,
        serving_steps=serving,
        workload=workload,
        bundle=bundle,
        prefill=prefill,
        decode=decode,
        arrival_time_s=arrival,
        needs=needs,
        kv_cache=kv_cache,
        bounds=plan.prediction_bounds(needs, cfg.vidur.predictor),
        max_tokens=plan.max_tokens_per_request(needs, knobs.block_size),
        engine_steps=engine_steps,
        step_jitter=jitter,
        frontend=frontend,
        frontend_queue=queue,
        replay=replay,
        after=after,
    )


FRONTEND_PASSES = 4
"""Simulations at most, when the front end's input delay grows with the requests in flight:
each pass takes those counts from the one before, until no delay moves by FRONTEND_TOLERANCE_S."""
FRONTEND_TOLERANCE_S = 1e-4


def write_trace(path: Path, inputs: Inputs, arrival_s: np.ndarray) -> Path:
    """Write the workload as Vidur's trace CSV (floats at full precision: exact arrivals)."""
    frame = plan.trace_frame(inputs.prefill, inputs.decode, arrival_s)
    with atomic_open(path) as handle:
        frame.to_csv(handle, index=False, lineterminator="\n")
    return path


def _pin_metrics_config(out_dir: Path, chrome_trace: bool) -> Any:
    """Vidur's MetricsConfig, writing into ``out_dir`` itself, with plots and wandb off.

    Its ``__post_init__`` appends a timestamp directory and creates it; we point it back at
    ``out_dir`` and remove the empty stamped directory.
    """
    from vidur.config import MetricsConfig

    metrics = MetricsConfig(
        write_metrics=True,
        write_json_trace=False,
        enable_chrome_trace=chrome_trace,
        save_table_to_wandb=False,
        store_plots=False,  # plotly/kaleido image export; CSVs of the CDFs are still written
        store_request_metrics=True,
        store_batch_metrics=True,
        store_utilization_metrics=True,
        output_dir=str(out_dir),
    )
    stamped = Path(metrics.output_dir)
    metrics.output_dir = str(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        stamped.rmdir()
    return metrics


@dataclass(frozen=True)
class BuiltConfig:
    """A Vidur SimulationConfig and what went into it (for run_meta)."""

    simulation_config: Any
    notes: dict[str, Any]


def build_simulation_config(
    cfg: VidurSimulateStageConfig, inputs: Inputs, out_dir: Path, trace_file: Path
) -> BuiltConfig:
    """Fresh Vidur configs for one simulation (Vidur mutates CacheConfig.num_blocks in place)."""
    from vidur.config import (
        CacheConfig,
        ClusterConfig,
        ReplicaConfig,
        RoundRobinGlobalSchedulerConfig,
        SimulationConfig,
        TraceRequestGeneratorConfig,
    )
    from vidur.utils.memory_planner import MemoryPlanner

    from gpu_simulate_test.vidur_simulate.models import patch_head_dim, vidur_derived_head_dim
    from gpu_simulate_test.vidur_simulate.predictor import predictor_config, vidur_version
    from gpu_simulate_test.vidur_simulate.registration import register_vidur_extensions
    from gpu_simulate_test.vidur_simulate.schedulers import vidur_scheduler_config

    model_name, device = register_vidur_extensions(cfg.model, cfg.hardware)
    knobs = cfg.vidur.scheduler
    replica = ReplicaConfig(
        model_name=model_name,
        num_pipeline_stages=1,  # Vidur's defaults are 2 stages x TP 8 on an h100
        tensor_parallel_size=1,
        device=device.device,
        network_device=device.network_device,
    )
    head_dim_patched = patch_head_dim(replica, cfg.model)
    cache = CacheConfig(
        block_size=knobs.block_size,
        num_blocks=inputs.kv_cache.num_blocks,
        watermark_blocks_fraction=knobs.watermark_blocks_fraction,
        memory_margin_fraction=knobs.memory_margin_fraction,
    )
    scheduler = vidur_scheduler_config(knobs)
    predictor = predictor_config(
        inputs.bundle, cfg.model, cfg.vidur.predictor, inputs.bounds, knobs.block_size
    )
    memory_tokens = MemoryPlanner(replica, cache).get_max_kv_cache_size_in_tokens()
    simulation_config = SimulationConfig(
        seed=cfg.vidur.seed,
        log_level="warning",
        time_limit=0,
        cluster_config=ClusterConfig(
            num_replicas=1,
            replica_config=replica,
            cache_config=cache,
            global_scheduler_config=RoundRobinGlobalSchedulerConfig(),
            replica_scheduler_config=scheduler,
        ),
        request_generator_config=TraceRequestGeneratorConfig(
            trace_file=str(trace_file),
            date=plan.TRACE_DATE,
            prefill_scale_factor=1.0,  # Vidur's defaults (0.3, 1, 0.04) rescale the trace
            decode_scale_factor=1.0,
            time_scale_factor=1.0,
            max_tokens=inputs.max_tokens,
        ),
        execution_time_predictor_config=predictor,
        metrics_config=_pin_metrics_config(out_dir, cfg.vidur.chrome_trace),
    )
    notes = {
        "vidur_version": vidur_version(),
        "vidur_model_name": model_name,
        "vidur_device": asdict(device),
        "vidur_scheduler_type": str(scheduler.get_type()),
        "head_dim": {
            "true": cfg.model.head_dim,
            "vidur_derived": vidur_derived_head_dim(cfg.model),
            "patched": head_dim_patched,
        },
        "kv_cache": {**asdict(inputs.kv_cache), "block_size": knobs.block_size},
        "vidur_memory_bound_batch_size": int(memory_tokens // inputs.max_tokens),
        "max_tokens_per_request": inputs.max_tokens,
        "predictor_fingerprint": predictor.fingerprint,
        "predictor_cache_dir": predictor.cache_dir,
    }
    return BuiltConfig(simulation_config, notes)


@dataclass(frozen=True)
class Simulated:
    """One simulated workload: the ``request_metrics`` table and how it was reached."""

    table: pd.DataFrame
    """REQUEST_METRICS columns (and Vidur's extras), in the workload's order."""
    result: SimulationResult
    scheduler_arrival_s: np.ndarray
    """When each request reached the simulated scheduler (front end included)."""
    passes: int
    notes: dict[str, Any]
    output_delay_s: float | np.ndarray = 0.0
    """Each request's first token's way back to the client (the front end's output side)."""


def simulate_inputs(cfg: VidurSimulateStageConfig, inputs: Inputs, out_dir: Path) -> Simulated:
    """Simulate checked ``inputs`` with Vidur's output in ``out_dir``: the front end's
    fixed-point passes (when its input delay grows with the requests in flight), the replay
    check and the normalized per-request table. The stage's :func:`run` and the capacity search
    (the same workload at many rates) both go through here."""
    arrival = inputs.scheduler_arrival_s()
    grows = inputs.frontend is not None and inputs.frontend.input_per_running_ms > 0
    grows = grows and inputs.after is None  # a closed loop: the front end at its idle delay
    segments = prompt_segments(
        inputs.workload.lengths, inputs.prefill, inputs.workload.sessions, inputs.decode
    )
    for done in range(1, FRONTEND_PASSES + 1):
        trace_file = write_trace(out_dir / TRACE_FILE, inputs, known_arrivals(arrival))
        built = build_simulation_config(cfg, inputs, out_dir, trace_file)
        result = simulate(
            SimulationRequest(
                built.simulation_config,
                engine_steps=inputs.engine_steps,
                backend=cfg.vidur.engine_overhead,
                step_jitter=inputs.step_jitter,
                event_loop=cfg.vidur.event_loop,
                lean_metrics=cfg.vidur.lean_metrics,
                step_log=cfg.vidur.step_log,
                step_time_scale=cfg.vidur.step_time_scale,
                v1=v1_params(cfg.vidur.scheduler, inputs.kv_cache.num_blocks),
                replay_clock=inputs.replay.clock if inputs.replay is not None else None,
                serving_steps=inputs.serving_steps,
                prompt_segments=segments,
                after=inputs.after,
            )
        )
        if not grows:
            break
        running = running_at_send(inputs.arrival_time_s, arrival, result.raw_metrics)
        moved = inputs.scheduler_arrival_s(running)
        if np.max(np.abs(moved - arrival), initial=0.0) <= FRONTEND_TOLERANCE_S:
            break
        if done < FRONTEND_PASSES:
            arrival = moved
    sent = inputs.arrival_time_s
    if inputs.after is not None:  # the closed loop's sends, as simulated
        arrival, sent = simulated_sends(result.raw_metrics, inputs.frontend, sent)
    rows = vidur_metrics.check_replay(
        result.raw_metrics,
        inputs.prefill,
        inputs.decode,
        arrival,
        str(out_dir / VIDUR_REQUEST_METRICS),
    )
    output_s = inputs.frontend.output_ms / 1000.0 if inputs.frontend is not None else 0.0
    first_s: float | np.ndarray = output_s
    last_s: float | np.ndarray = output_s
    if inputs.frontend_queue is not None and result.schedule is not None and inputs.replay is None:
        # a prompt's first token comes with its last scheduled chunk: the cached part is not
        scheduled = inputs.prefill
        if V1_CACHED_TOKENS in rows.columns:
            scheduled = inputs.prefill - rows[V1_CACHED_TOKENS].to_numpy(dtype=np.int64)
        first_s, last_s = request_delays_s(inputs.frontend_queue, result.schedule, scheduled, sent)
    held = np.zeros(len(arrival))
    if V1_ENGINE_QUEUED in rows.columns and inputs.replay is None:
        # held back while a step ran: on the client's clock, not the engine's (as vLLM stamps)
        held = np.maximum(0.0, rows[V1_ENGINE_QUEUED].to_numpy(dtype=float) - arrival)
    table = vidur_metrics.normalize(
        rows,
        inputs.prefill,
        inputs.decode,
        sent,
        arrival - sent + first_s,
        held,
        arrival - sent + last_s,
    )
    if V1_CACHED_TOKENS in rows.columns:
        table[V1_CACHED_TOKENS] = rows[V1_CACHED_TOKENS].to_numpy(dtype=np.int64)
    return Simulated(table, result, arrival, done, built.notes, first_s)


def run(cfg: VidurSimulateStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """Simulate ``cfg.workload_dir`` into ``<output.root>/vidur_simulate/<run_id>/`` (an oracle
    replay with the scheduler knobs of the run it replays)."""
    cfg = with_run_knobs(cfg)
    resolved_config = recorded_config(resolved_config, cfg)
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    inputs = prepare(cfg)  # every input error surfaces here, before the run exists
    with start_run(
        cfg.output.root, "vidur_simulate", run_id, resolved_config, cfg.output.overwrite
    ) as r:
        r.update_meta(
            workload_id=inputs.workload.workload_id,
            workload_dir=str(inputs.workload.path),
            num_requests=len(inputs.prefill),
            bundle_path=str(inputs.bundle.path),
            bundle_dtype=inputs.kv_cache.dtype,
            scheduler=asdict(cfg.vidur.scheduler),
            requirements=asdict(inputs.needs),
            prediction_bounds=inputs.bounds,
            arrivals_from=cfg.arrivals_from,
            step_times_from=cfg.step_times_from,
            frontend=asdict(inputs.frontend) if inputs.frontend is not None else None,
            frontend_queue=(
                inputs.frontend_queue.to_dict() if inputs.frontend_queue is not None else None
            ),
            # the host's memory speed when the bundle was calibrated (compare's host_memory)
            calibration_host_probe=(
                inputs.calibration.host_probe if inputs.calibration is not None else None
            ),
        )
        sim = simulate_inputs(cfg, inputs, r.file(VIDUR_DIR))
        result, table = sim.result, sim.table
        r.update_meta(
            num_blocks=inputs.kv_cache.num_blocks,
            frontend_passes=sim.passes,
            # over the requests with a scheduled send: a multi-turn workload's later turns
            # have none (closed loop), and pay the idle front end's way in by construction
            mean_frontend_input_ms=float(
                np.nanmean(sim.scheduler_arrival_s - inputs.arrival_time_s) * 1000.0
            ),
            mean_frontend_output_ms=float(np.nanmean(sim.output_delay_s) * 1000.0),
            **sim.notes,
        )
        if result.engine_overhead_fit is not None:
            with atomic_open(r.file(ENGINE_OVERHEAD_FIT)) as handle:
                result.engine_overhead_fit.to_csv(handle, index=False, lineterminator="\n")
        r.update_meta(
            engine_overhead=result.engine_overhead,
            predictor_cache="hit" if result.predictor_cache_hit else "miss",
            event_loop=result.event_loop,
            event_loop_note=result.event_loop_note,
            preemptions=result.preemptions,
            prefix_cache=prefix_cache_meta(result.prefix_cache),
            oracle=result.oracle,
            serving_load=serving_report(
                result, inputs.calibration, inputs.serving_steps, r.file(layout.STEP_RESIDUALS_PLOT)
            ),
            timings_s={
                "predictor_setup": round(result.predictor_setup_s, 3),
                "simulation": round(result.simulation_s, 3),
            },
        )
        write_csv(r.file(layout.REQUEST_METRICS), table, REQUEST_METRICS)
        if result.steps is not None:
            write_csv(r.file(layout.ENGINE_STEP_LOG), result.steps, ENGINE_STEP_LOG)
        if result.schedule is not None:
            ids = inputs.workload.intervals["request_id"].to_numpy()
            write_csv(
                r.file(layout.ENGINE_SCHEDULE),
                schedule_with_ids(result.schedule, ids),
                ENGINE_SCHEDULE,
            )
        summary = vidur_metrics.summarize(table, cfg.goodput)
        r.update_meta(summary=summary)
    if cfg.progress:
        print_summary(summary, cfg, inputs, r.path)
    return r.path


def print_summary(
    summary: Mapping[str, Any], cfg: VidurSimulateStageConfig, inputs: Inputs, path: Path
) -> None:
    knobs = cfg.vidur.scheduler
    print_table(
        f"vidur {knobs.name} (cap {knobs.batch_size_cap}), {cfg.model.name} on "
        f"{cfg.hardware.name}, {summary['num_requests']} requests of {inputs.workload.workload_id}",
        ["metric (ms)", "p50", "p90", "p99"],
        vidur_metrics.summary_rows(summary),
    )
    console.print(f"[bold]artifacts:[/] {path}")
