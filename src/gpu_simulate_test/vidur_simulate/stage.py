"""The ``vidur_simulate`` stage: replay a workload run in Vidur with a local profiling bundle.

Order of work: read and check every input (workload, bundle, coverage, KV cache) without
importing Vidur; create the run; write the trace; build fresh Vidur configs; reset Vidur's entity
ids and seeds; build the simulator (trains or loads the predictor) and run it; check the replay
and write ``request_metrics.csv`` in the real bench's schema next to Vidur's raw output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.frontend_queue import input_waits_s, request_delays_s
from gpu_simulate_test.calibration.record import CalibrationRecord
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.vidur import VidurSimulateStageConfig
from gpu_simulate_test.core.profiling.bundle import load_bundle
from gpu_simulate_test.core.reporting import console, print_table
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import atomic_open, write_csv
from gpu_simulate_test.io.runs import default_run_id, start_run
from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE, ENGINE_STEP_LOG, REQUEST_METRICS
from gpu_simulate_test.simulator.step_model import StepModel
from gpu_simulate_test.simulator.types import CACHED_TOKENS as V1_CACHED_TOKENS
from gpu_simulate_test.simulator.types import ENGINE
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
from gpu_simulate_test.vidur_simulate.fleet_report import fleet_meta, fleet_rows
from gpu_simulate_test.vidur_simulate.in_memory import fleet_spec, simulate_v1
from gpu_simulate_test.vidur_simulate.inputs import (
    Inputs,
    front_end_inputs,
    running_at_send,
    serving_steps_of,
)
from gpu_simulate_test.vidur_simulate.prompt_origins import (
    known_arrivals,
    prefix_cache_meta,
    prompt_segments,
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
from gpu_simulate_test.vidur_simulate.vidur_config import build_simulation_config


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
        if replay.engines != cfg.fleet.replicas:
            router = (
                " fleet.router=vllm_dp (a --data-parallel-size server's own balancer; N servers: "
                "fleet.router=<the run's backend.router>)"
                if replay.engines > 1
                else ""
            )
            raise ConfigError(
                f"step_times_from={cfg.step_times_from} ran {replay.engines} engine(s) "
                f"(backend.data_parallel_size or backend.servers), fleet.replicas="
                f"{cfg.fleet.replicas}: replay it as fleet.replicas={replay.engines}{router}"
            )
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
    serving = None
    if record is not None and cfg.vidur.serving_load and cfg.vidur.scheduler.name == V1_NAME:
        serving = serving_steps_of(record.serving_steps, cfg.vidur.serving_intake)
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
        replay=replay,
        **front_end_inputs(cfg, record, workload, replay is not None, len(arrival)),
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


def step_model_of(cfg: VidurSimulateStageConfig, inputs: Inputs, out_dir: Path) -> StepModel | None:
    """The step model a simulation of ``inputs`` times steps with (built once: trains or loads
    Vidur's predictor and fits the calibration against it), for a caller that simulates them
    many times (a capacity search's rates); None where steps are not timed by one (Vidur's own
    schedulers, an oracle replay)."""
    from gpu_simulate_test.vidur_simulate.simulator_v1 import build_step_model

    if cfg.vidur.scheduler.name != V1_NAME or inputs.replay is not None:
        return None
    built = build_simulation_config(cfg, inputs, out_dir, out_dir / TRACE_FILE)
    return build_step_model(_request(cfg, inputs, built.simulation_config, None, None))


def _request(
    cfg: VidurSimulateStageConfig,
    inputs: Inputs,
    simulation_config: Any,
    segments: Any,
    step_model: StepModel | None,
) -> SimulationRequest:
    return SimulationRequest(
        simulation_config,
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
        step_model=step_model,
        fleet=fleet_spec(cfg.fleet),
        sent_s=inputs.sent_s,
        wake_spread=cfg.vidur.wake_spread,
        busy_spread=cfg.vidur.busy_spread,
        intake_catch=cfg.vidur.intake_catch,
        intake_pause=cfg.vidur.intake_pause,
        intake_step=cfg.vidur.intake_step,
        progress=cfg.progress,
    )


def scheduled_prompts(prefill: np.ndarray, rows: pd.DataFrame) -> np.ndarray:
    """Each prompt's tokens the engine computed (``rows`` in the workload's order): its first
    token comes with its last scheduled chunk, and a prefix-cache hit's part is not scheduled."""
    if V1_CACHED_TOKENS not in rows.columns:
        return prefill
    return prefill - rows[V1_CACHED_TOKENS].to_numpy(dtype=np.int64)


def next_arrivals(
    cfg: VidurSimulateStageConfig, inputs: Inputs, arrival: np.ndarray, result: SimulationResult
) -> np.ndarray:
    """When requests reach the scheduler by the front end's input model, read off the last
    simulation (``result``, at ``arrival``): the line in the requests in flight at each send,
    or (``vidur.frontend_input=queue``) the wait behind the front end's other work."""
    if not inputs.input_by_queue:
        running = running_at_send(
            inputs.arrival_time_s, arrival, result.raw_metrics, per_server=per_server(cfg)
        )
        return inputs.scheduler_arrival_s(running)
    assert inputs.frontend_queue is not None and result.schedule is not None
    raw = result.raw_metrics.sort_values(vidur_metrics.VIDUR_ID, kind="stable")
    waits = input_waits_s(
        inputs.frontend_queue,
        result.schedule.sort_values("end_time_s", kind="stable"),
        scheduled_prompts(inputs.prefill, raw),
        inputs.arrival_time_s,
    )
    return inputs.scheduler_arrival_s(waits=waits)


def simulate_inputs(
    cfg: VidurSimulateStageConfig,
    inputs: Inputs,
    out_dir: Path | None,
    step_model: StepModel | None = None,
) -> Simulated:
    """Simulate checked ``inputs`` with Vidur's output in ``out_dir``: the front end's
    fixed-point passes (when its input delay grows with the requests in flight), the replay
    check and the normalized per-request table. The stage's :func:`run` and the capacity search
    (the same workload at many rates) both go through here, the latter with the ``step_model``
    it built once (:func:`step_model_of`); with no ``out_dir``, ``vllm_v1`` runs in memory (no
    trace, no Vidur config, no files: a tune's thousands of simulations)."""
    arrival = inputs.scheduler_arrival_s()
    grows = inputs.frontend is not None and inputs.frontend.moves_with_load
    grows = (grows or inputs.input_by_queue) and inputs.after is None  # a closed loop: idle
    segments = prompt_segments(
        inputs.workload.lengths, inputs.prefill, inputs.workload.sessions, inputs.decode
    )
    in_memory = out_dir is None
    if in_memory and (step_model is None or inputs.replay is not None):
        raise ValueError("in memory, vllm_v1 simulates with a step model (not a replay)")
    notes: dict[str, Any] = {}
    for done in range(1, FRONTEND_PASSES + 1):
        if in_memory:
            assert step_model is not None
            result = simulate_v1(cfg, inputs, known_arrivals(arrival), segments, step_model)
        else:
            assert out_dir is not None
            trace_file = write_trace(out_dir / TRACE_FILE, inputs, known_arrivals(arrival))
            built = build_simulation_config(cfg, inputs, out_dir, trace_file)
            notes = built.notes
            result = simulate(_request(cfg, inputs, built.simulation_config, segments, step_model))
        if not grows:
            break
        moved = next_arrivals(cfg, inputs, arrival, result)
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
        str(out_dir / VIDUR_REQUEST_METRICS) if out_dir is not None else "the simulation",
    )
    output_s = inputs.frontend.output_ms / 1000.0 if inputs.frontend is not None else 0.0
    first_s: float | np.ndarray = output_s
    last_s: float | np.ndarray = output_s
    if inputs.frontend_queue is not None and result.schedule is not None and inputs.replay is None:
        scheduled = scheduled_prompts(inputs.prefill, rows)
        # vLLM -dp: one API server in front of the engines, their steps' outputs in time order;
        # N servers: each its own API server, its engine's steps only
        schedule = result.schedule.sort_values("end_time_s", kind="stable")
        if per_server(cfg) and ENGINE in schedule.columns and ENGINE in rows.columns:
            first_s, last_s = np.full(len(sent), np.nan), np.full(len(sent), np.nan)
            engine_of = rows[ENGINE].to_numpy()
            for k in np.unique(engine_of):
                mine = np.where(engine_of == k, sent, np.nan)
                own = schedule[schedule[ENGINE] == k]
                first_k, last_k = request_delays_s(inputs.frontend_queue, own, scheduled, mine)
                first_s = np.where(engine_of == k, first_k, first_s)
                last_s = np.where(engine_of == k, last_k, last_s)
        else:
            first_s, last_s = request_delays_s(inputs.frontend_queue, schedule, scheduled, sent)
        if inputs.first_spread_levels is not None:  # the first token's way back, as measured
            running = running_at_send(sent, arrival, result.raw_metrics, per_server(cfg))
            first_s = np.maximum(first_s + inputs.first_token_spread_s(running), 0.0)
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
        first_s,
    )
    for column in (V1_CACHED_TOKENS, ENGINE):
        if column in rows.columns:
            table[column] = rows[column].to_numpy(dtype=np.int64)
    return Simulated(table, result, arrival, done, notes, first_s)


def first_spread_note(cfg: VidurSimulateStageConfig, inputs: Inputs) -> str:
    """What ``run_meta.json`` says of the first tokens' way back spread
    (``vidur.frontend_idle_spread``, ``vidur.frontend_busy_spread``)."""
    queue = inputs.frontend_queue
    idle = cfg.vidur.frontend_idle_spread and queue is not None and queue.first_idle_residual_ms
    busy = cfg.vidur.frontend_busy_spread and queue is not None and queue.first_busy_residual_ms
    if inputs.first_spread_levels is not None and (idle or busy):
        sent = " and ".join(w for w, on in (("an idle", idle), ("a busy", busy)) if on)
        return f"drawn (seed {cfg.vidur.seed}, the first tokens of requests sent to {sent} engine)"
    if not (cfg.vidur.frontend_idle_spread or cfg.vidur.frontend_busy_spread):
        return "off"
    return (
        "none: no frontend.queue.first_idle_residual_ms (a calibration before version 16) or "
        "first_busy_residual_ms (before 18)"
    )


def per_server(cfg: VidurSimulateStageConfig) -> bool:
    """A fleet of servers behind a router in front of them, each server with its own API
    server (its own front end); ``vllm_dp`` is one server's engines behind one API server."""
    return cfg.fleet.replicas > 1 and cfg.fleet.router != "vllm_dp"


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
            frontend_input="queue" if inputs.input_by_queue else "line",
            frontend_input_spread=inputs.input_spread_note,
            frontend_busy_hop=inputs.busy_hop_note,
            frontend_first_token_spread=first_spread_note(cfg, inputs),
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
        fleet = fleet_meta(table, cfg.fleet)
        r.update_meta(summary=summary, fleet=fleet)
    if cfg.progress:
        print_summary(summary, cfg, inputs, r.path, fleet)
    return r.path


def print_summary(
    summary: Mapping[str, Any],
    cfg: VidurSimulateStageConfig,
    inputs: Inputs,
    path: Path,
    fleet: Mapping[str, Any] | None = None,
) -> None:
    knobs = cfg.vidur.scheduler
    replicas = f"{cfg.fleet.replicas} x " if fleet is not None else ""
    print_table(
        f"vidur {knobs.name} (cap {knobs.batch_size_cap}), {replicas}{cfg.model.name} on "
        f"{cfg.hardware.name}, {summary['num_requests']} requests of {inputs.workload.workload_id}",
        ["metric (ms)", "p50", "p90", "p99"],
        vidur_metrics.summary_rows(summary),
    )
    if fleet is not None:
        print_table(
            f"per replica behind {fleet['router']} (most loaded / mean: {fleet['imbalance']})",
            ["engine", "requests", "TTFT p50", "TTFT p90", "E2E p50", "E2E p90"],
            fleet_rows(dict(fleet)),
        )
    console.print(f"[bold]artifacts:[/] {path}")
