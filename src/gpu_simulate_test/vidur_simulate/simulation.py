"""Run one Vidur simulation: on our event loop (:mod:`.event_loop`) or on Vidur's own.

Both start from the same clean slate (Vidur's entity ids and seeds reset), build the same
predictor, fit the same engine overhead and write the same ``request_metrics.csv``. Vidur's loop
(``vidur.event_loop=vidur``) is the reference; ours is chosen by default and hands over to Vidur's
whenever it cannot reproduce a simulation (:func:`loop_setup.unsupported_reason`, or KV-cache
preemption found on the way), which the result records.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import overhead
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.vidur import DEFAULT_EVENT_LOOP, EVENT_LOOPS
from gpu_simulate_test.io.artifacts import atomic_open
from gpu_simulate_test.vidur_simulate.contract import VIDUR_REQUEST_METRICS
from gpu_simulate_test.vidur_simulate.lean_metrics import LeanMetrics


@dataclass(frozen=True)
class SimulationResult:
    raw_metrics: pd.DataFrame
    predictor_setup_s: float
    simulation_s: float
    predictor_cache_hit: bool
    engine_overhead: dict[str, Any] | None = None
    """The fitted per-step overhead and its calibration errors (None: not modelled)."""
    engine_overhead_fit: pd.DataFrame | None = None
    """Per calibration step: measured, Vidur's ops, fitted overhead, error."""
    steps: pd.DataFrame | None = None
    """Every simulated batch, as the ``engine_step_log`` table (no times: Vidur keeps none)."""
    event_loop: str = "vidur"
    """The loop that ran: ``fast`` (ours) or ``vidur``."""
    event_loop_note: str | None = None
    """Why Vidur's loop ran when ours was asked for."""
    schedule: pd.DataFrame | None = None
    """vllm_v1: every step with its requests (the ``engine_schedule`` table, rows by the
    trace's request order)."""
    preemptions: int | None = None
    """vllm_v1: requests preempted (restarted) for lack of KV blocks."""
    oracle: dict[str, Any] | None = None
    """An oracle replay: where its step times came from (:meth:`.oracle.OracleClock.report`)."""
    serving_fit: tuple[Any, pd.DataFrame, np.ndarray] | None = None
    """vllm_v1 with the bundle's calibration replays: the fitted
    :class:`~gpu_simulate_test.calibration.serving_load.ServingLoad`, the replays' step features and
    each step's prediction (for the report and ``step_residuals.png``)."""


def steps_frame(ids: Any, size: Any, prefill: Any, decode: Any, elapsed_s: Any) -> pd.DataFrame:
    """Batches as rows of the ``engine_step_log`` table, so they line up with a real engine's
    steps: requests and tokens by phase and the batch's execution time. A decode is one token
    of one request; Vidur counts a one-token prefill chunk as a decode."""
    size = np.asarray(size, dtype=np.int64)
    decode = np.asarray(decode, dtype=np.int64)
    return pd.DataFrame(
        {
            "step_index": np.asarray(ids, dtype=np.int64),
            "time_s": np.full(len(size), np.nan),
            "num_prefill_requests": size - decode,
            "num_prefill_tokens": np.asarray(prefill, dtype=np.int64),
            "num_decode_requests": decode,
            "num_decode_tokens": decode,
            "elapsed_ms": 1000.0 * np.asarray(elapsed_s, dtype=float),
            "kv_cache_usage_pct": np.full(len(size), np.nan),
        }
    )


def batch_steps(metric_store: Any) -> pd.DataFrame:
    """Vidur's batches from the metric store's per-batch series (kept for every batch whatever
    Vidur writes), or from the lean store's :class:`LeanMetrics`, which records the same values."""
    if isinstance(metric_store, LeanMetrics):
        series = metric_store.batch_series()
        size, prefill = series["size"], series["prefill"]
        decode, elapsed = series["decode"], series["time"]
    else:
        size, prefill, decode, elapsed = _store_series(metric_store)
    ids = sorted(size)
    return steps_frame(
        ids,
        [int(size[i]) for i in ids],
        [int(prefill[i]) for i in ids],
        [int(decode[i]) for i in ids],
        [elapsed[i] for i in ids],
    )


def _store_series(metric_store: Any) -> tuple[dict[int, float], ...]:
    from vidur.metrics.constants import BatchMetricsCountDistribution, BatchMetricsTimeDistribution

    counts = metric_store._batch_metrics_count_distribution_per_batch
    times = metric_store._batch_metrics_time_distribution_per_batch

    def series(store: Any, key: Any) -> dict[int, float]:
        return {int(x): float(y) for x, y in store[key]._data_series}

    return (
        series(counts, BatchMetricsCountDistribution.BATCH_SIZE),
        series(counts, BatchMetricsCountDistribution.BATCH_NUM_PREFILL_TOKENS),
        series(counts, BatchMetricsCountDistribution.BATCH_NUM_DECODE_TOKENS),
        series(times, BatchMetricsTimeDistribution.BATCH_EXECUTION_TIME),
    )


def _clean_slate(seed: int) -> float:
    """Rewind Vidur's entity ids and seed its random generators; returns the start time."""
    from vidur.utils.random import set_seeds

    from gpu_simulate_test.vidur_simulate.registration import reset_entity_ids

    reset_entity_ids()
    set_seeds(seed)
    return time.perf_counter()


def _write_raw(out_dir: Path, requests: pd.DataFrame) -> pd.DataFrame:
    """Vidur's ``request_metrics.csv`` from the rows a lean store or our loop recorded."""
    with atomic_open(out_dir / VIDUR_REQUEST_METRICS) as handle:
        requests.to_csv(handle, index=False, lineterminator="\n")
    return requests


def _attach_overhead(
    predictor: Any,
    seed: int,
    engine_steps: pd.DataFrame | None,
    backend: str,
    jitter: overhead.StepJitter | None,
) -> tuple[dict[str, Any] | None, pd.DataFrame | None]:
    """Fit the engine's per-step overhead against this predictor and attach it (with the
    seeded jitter draws); returns the fit's report and table (None, None: no overhead)."""
    if engine_steps is None:
        return None, None
    step_overhead, table = overhead.fit(backend, engine_steps, predictor.ops_time_ms)
    draw = jitter.sampler(seed) if jitter is not None else None
    predictor.attach_overhead(step_overhead, draw)
    report = overhead.fit_report(step_overhead, table)
    if jitter is not None:
        report["step_jitter"] = {**asdict(jitter), "mean_ratio": jitter.mean_ratio}
    return report, table


def simulate(
    simulation_config: Any,
    engine_steps: pd.DataFrame | None = None,
    backend: str = "",
    jitter: overhead.StepJitter | None = None,
    lean: bool = True,
    event_loop: str = DEFAULT_EVENT_LOOP,
    steps: bool = True,
    v1: Any = None,
    clock: Any = None,
    serving: pd.DataFrame | None = None,
    step_scale: float = 1.0,
) -> SimulationResult:
    """Run one simulation from a clean slate (entity ids, seeds) and read Vidur's request rows.

    With ``engine_steps`` (one backend's calibration rows), the engine's per-step overhead is
    fitted against this predictor and added to every batch before the event loop starts; with
    ``jitter`` too, every batch's time is multiplied by a seeded draw from it. ``event_loop``
    ``fast`` runs ours where it reproduces Vidur (else Vidur's with the lean store, noted in the
    result); ``lean`` gives Vidur's loop the stage's lean metrics store (``vidur.lean_metrics``).
    ``steps`` false leaves the result's ``steps`` (one row per batch) out. With ``v1``
    (:class:`.vllm_v1.V1Params`) vLLM's V1 scheduler runs in our loop (Vidur has none), timed
    by Vidur's predictor or by ``clock`` (an oracle replay's :class:`.oracle.OracleClock`).
    ``step_scale`` multiplies every predicted step (``vidur.step_time_scale``; not a ``clock``'s).
    """
    if clock is not None and step_scale != 1.0:
        raise ConfigError(
            f"vidur.step_time_scale={step_scale} scales predicted steps; an oracle replay's "
            "steps are the engine's own: leave one of the two out"
        )
    if v1 is not None:
        if event_loop != "fast":
            raise ConfigError(
                "vidur.scheduler.name=vllm_v1 runs in our event loop only (Vidur has no vLLM V1 "
                f"scheduler): leave vidur.event_loop={event_loop} out"
            )
        return _simulate_v1(
            simulation_config, engine_steps, backend, jitter, steps, v1, clock, serving, step_scale
        )
    from gpu_simulate_test.vidur_simulate.loop_setup import (
        KvCacheExhausted,
        NeedsVidurLoop,
        unsupported_reason,
    )

    if event_loop not in EVENT_LOOPS:
        raise ValueError(f"event_loop must be one of {EVENT_LOOPS}, got {event_loop!r}")
    note, exhausted = None, None
    if event_loop == "fast":
        note = unsupported_reason(simulation_config)
        if note is None:
            try:
                return _simulate_fast(
                    simulation_config, engine_steps, backend, jitter, steps, step_scale
                )
            except NeedsVidurLoop as exc:
                note = f"Vidur's loop ran: {exc}"
                exhausted = exc if isinstance(exc, KvCacheExhausted) else None
        else:
            note = f"Vidur's loop ran: our loop does not simulate {note}"
        lean = True
    try:
        result = _simulate_vidur(
            simulation_config, engine_steps, backend, jitter, lean, steps, step_scale
        )
    except AssertionError as exc:
        if exhausted is None:
            raise
        raise ConfigError(
            f"vidur.scheduler.num_blocks: the KV cache runs out ({exhausted}), so requests "
            "would be preempted and restarted, which Vidur 0.0.26 fails to simulate (an "
            "assertion in its Request); give the cache more blocks (vidur.scheduler.num_blocks, "
            "0 sizes it from device memory) or lower vidur.scheduler.batch_size_cap"
        ) from exc
    if note is None:
        return result
    return replace(result, event_loop_note=note)


def _simulate_vidur(
    simulation_config: Any,
    engine_steps: pd.DataFrame | None,
    backend: str,
    jitter: overhead.StepJitter | None,
    lean: bool,
    steps: bool,
    step_scale: float = 1.0,
) -> SimulationResult:
    from vidur.simulator import Simulator

    start = _clean_slate(simulation_config.seed)
    simulator = Simulator(simulation_config)  # trains or loads the predictor
    # the global scheduler builds one predictor and hands it to every replica scheduler
    replica_scheduler = next(iter(simulator.scheduler._replica_schedulers.values()))
    predictor = replica_scheduler._execution_time_predictor
    report, table = _attach_overhead(
        predictor, simulation_config.seed, engine_steps, backend, jitter
    )
    predictor.step_scale = step_scale
    if lean:  # vidur.lean_metrics: record what this stage reads, nothing else
        simulator._metric_store = LeanMetrics()
    built = time.perf_counter()
    simulator.run()  # event loop, then Vidur writes its metrics
    done = time.perf_counter()
    out_dir = Path(simulation_config.metrics_config.output_dir)
    if isinstance(simulator.metric_store, LeanMetrics):
        raw = _write_raw(out_dir, simulator.metric_store.request_frame())
    else:
        raw = pd.read_csv(out_dir / VIDUR_REQUEST_METRICS)
    return SimulationResult(
        raw_metrics=raw,
        predictor_setup_s=built - start,
        simulation_s=done - built,
        predictor_cache_hit=bool(predictor.cache_hit),
        engine_overhead=report,
        engine_overhead_fit=table,
        steps=batch_steps(simulator.metric_store) if steps else None,
    )


def build_predictor(simulation_config: Any) -> tuple[Any, Any]:
    """Vidur's predictor and replica scheduler for this config, built as Vidur's global scheduler
    builds them (without the simulator, its requests or its event queue)."""
    from vidur.entities import Replica
    from vidur.execution_time_predictor import ExecutionTimePredictorRegistry
    from vidur.scheduler.replica_scheduler.replica_scheduler_registry import (
        ReplicaSchedulerRegistry,
    )

    cluster = simulation_config.cluster_config
    predictor = ExecutionTimePredictorRegistry.get(
        simulation_config.execution_time_predictor_config.get_type(),
        predictor_config=simulation_config.execution_time_predictor_config,
        replica_config=cluster.replica_config,
        cache_config=cluster.cache_config,
    )
    replica_scheduler = ReplicaSchedulerRegistry.get(
        cluster.replica_scheduler_config.get_type(),
        replica_config=cluster.replica_config,
        replica_scheduler_config=cluster.replica_scheduler_config,
        cache_config=cluster.cache_config,
        request_generator_config=simulation_config.request_generator_config,
        replica=Replica(cluster.replica_config),
        num_stages=cluster.replica_config.num_pipeline_stages,
        execution_time_predictor=predictor,
    )
    return predictor, replica_scheduler


def _simulate_fast(
    simulation_config: Any,
    engine_steps: pd.DataFrame | None,
    backend: str,
    jitter: overhead.StepJitter | None,
    steps: bool,
    step_scale: float = 1.0,
) -> SimulationResult:
    from vidur.entities import Batch
    from vidur.request_generator.trace_replay_request_generator import (
        TraceReplayRequestGenerator,
    )

    from gpu_simulate_test.vidur_simulate.event_loop import run_loop
    from gpu_simulate_test.vidur_simulate.loop_setup import BatchTimer, params_from_scheduler

    start = _clean_slate(simulation_config.seed)
    predictor, replica_scheduler = build_predictor(simulation_config)  # trains or loads
    params = params_from_scheduler(replica_scheduler)
    report, table = _attach_overhead(
        predictor, simulation_config.seed, engine_steps, backend, jitter
    )
    predictor.step_scale = step_scale
    # Vidur's trace reader, for its clipping and scaling of the token counts
    trace = TraceReplayRequestGenerator(simulation_config.request_generator_config).trace_df
    timer = BatchTimer(predictor)
    built = time.perf_counter()
    loop = run_loop(
        params,
        timer,
        trace["Time"].to_numpy(dtype=float),
        trace["PromptTokenCount"].to_numpy(),
        trace["CompletionTokenCount"].to_numpy(),
        first_batch_id=Batch._id + 1,
        record_steps=steps,
    )
    Batch._id += loop.num_batches  # as if Vidur had numbered them
    done = time.perf_counter()
    out_dir = Path(simulation_config.metrics_config.output_dir)
    return SimulationResult(
        raw_metrics=_write_raw(out_dir, loop.requests),
        predictor_setup_s=built - start,
        simulation_s=done - built,
        predictor_cache_hit=bool(predictor.cache_hit),
        engine_overhead=report,
        engine_overhead_fit=table,
        steps=steps_frame(
            loop.batch_ids,
            loop.batch_size,
            loop.batch_prefill_tokens,
            loop.batch_decode_tokens,
            loop.batch_time_s,
        )
        if steps
        else None,
        event_loop="fast",
    )


def _simulate_v1(
    simulation_config: Any,
    engine_steps: pd.DataFrame | None,
    backend: str,
    jitter: overhead.StepJitter | None,
    steps: bool,
    v1: Any,
    clock: Any,
    serving: pd.DataFrame | None = None,
    step_scale: float = 1.0,
) -> SimulationResult:
    """vLLM's V1 scheduler (:func:`.vllm_v1.run_v1`) over Vidur's trace reader, timed by Vidur's
    predictor (built, and its overhead fitted, as for Vidur's schedulers) or by ``clock``."""
    from vidur.request_generator.trace_replay_request_generator import (
        TraceReplayRequestGenerator,
    )

    from gpu_simulate_test.core.engines.step_record import step_log_rows
    from gpu_simulate_test.vidur_simulate.loop_setup import BatchTimer, unsupported_reason
    from gpu_simulate_test.vidur_simulate.predictor_clock import PredictorClock, fit_serving
    from gpu_simulate_test.vidur_simulate.vllm_v1 import run_v1

    reason = unsupported_reason(simulation_config)
    if reason is not None:
        raise ConfigError(f"vidur.scheduler.name=vllm_v1 simulates one engine, not {reason}")
    start = _clean_slate(simulation_config.seed)
    report = table = None
    serving_fit = None
    cache_hit = False
    if clock is None:
        predictor, _ = build_predictor(simulation_config)  # trains or loads
        report, table = _attach_overhead(
            predictor, simulation_config.seed, engine_steps, backend, jitter
        )
        timer = BatchTimer(predictor)
        load = None
        if serving is not None and report is not None:
            load, features, predicted = fit_serving(timer, serving)
            serving_fit = (load, features, predicted)
        clock = PredictorClock(timer, load, int(simulation_config.seed), step_scale)
        cache_hit = bool(predictor.cache_hit)
    trace = TraceReplayRequestGenerator(simulation_config.request_generator_config).trace_df
    built = time.perf_counter()
    loop = run_v1(
        v1,
        clock,
        trace["Time"].to_numpy(dtype=float),
        trace["PromptTokenCount"].to_numpy(),
        trace["CompletionTokenCount"].to_numpy(),
    )
    done = time.perf_counter()
    out_dir = Path(simulation_config.metrics_config.output_dir)
    schedule = loop.schedule
    return SimulationResult(
        raw_metrics=_write_raw(out_dir, loop.requests),
        predictor_setup_s=built - start,
        simulation_s=done - built,
        predictor_cache_hit=cache_hit,
        engine_overhead=report,
        engine_overhead_fit=table,
        steps=step_log_rows(schedule, timed=False) if steps else None,
        event_loop="fast",
        schedule=schedule if steps else None,
        preemptions=loop.preemptions,
        oracle=clock.report() if hasattr(clock, "report") else None,
        serving_fit=serving_fit,
    )
