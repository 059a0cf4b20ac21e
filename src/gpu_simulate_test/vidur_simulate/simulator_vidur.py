"""Vidur's own loop (``vidur.event_loop=vidur``, and where ours hands over): ``Simulator.run``
with our predictor, its fitted engine overhead and, by default, the stage's lean metrics store.

Vidur's events are taken through :class:`.vidur_engine.VidurEngine`, the interface the other
engines have (``Simulator.run`` event for event). It is the reference the other loops are
checked against (``tests/unit/vidur_simulate/test_vidur_event_loop.py``) and the only one that
simulates what ours does not: more than one replica or pipeline stage, KV-cache preemption, a
chrome trace, a time limit (:func:`.loop_setup.unsupported_reason`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from gpu_simulate_test.vidur_simulate.contract import VIDUR_REQUEST_METRICS
from gpu_simulate_test.vidur_simulate.lean_metrics import LeanMetrics
from gpu_simulate_test.vidur_simulate.simulator import (
    SimulationRequest,
    SimulationResult,
    attach_overhead,
    clean_slate,
    steps_frame,
    write_raw,
)
from gpu_simulate_test.vidur_simulate.vidur_engine import VidurEngine


@dataclass(frozen=True)
class VidurSimulator:
    """A :class:`~.simulator.Simulator` on Vidur's ``Simulator.run``."""

    note: str | None = None
    """Why Vidur's loop runs when ours was asked for (the result's ``event_loop_note``)."""
    stepped: bool = True
    """Take Vidur's events through :class:`.vidur_engine.VidurEngine` (the engine interface,
    event for event ``Simulator.run``); False: ``Simulator.run`` itself."""

    def run(self, request: SimulationRequest) -> SimulationResult:
        from vidur.simulator import Simulator

        config = request.simulation_config
        start = clean_slate(request.seed)
        simulator = Simulator(config)  # trains or loads the predictor
        # the global scheduler builds one predictor and hands it to every replica scheduler
        replica_scheduler = next(iter(simulator.scheduler._replica_schedulers.values()))
        predictor = replica_scheduler._execution_time_predictor
        report, table = attach_overhead(predictor, request)
        predictor.step_scale = request.step_time_scale
        # vidur.lean_metrics: record what the stage reads, nothing else; Vidur's own store only
        # when Vidur's loop was asked for (a hand-over from ours is always lean)
        if request.lean_metrics or request.event_loop != "vidur":
            simulator._metric_store = LeanMetrics()
        built = time.perf_counter()
        if self.stepped:
            engine = VidurEngine(simulator)
            engine.add_all()
            engine.advance()
            engine.close()  # Vidur writes its metrics
        else:
            simulator.run()  # event loop, then Vidur writes its metrics
        done = time.perf_counter()
        if isinstance(simulator.metric_store, LeanMetrics):
            raw = write_raw(request.output_dir, simulator.metric_store.request_frame())
        else:
            raw = pd.read_csv(request.output_dir / VIDUR_REQUEST_METRICS)
        result = SimulationResult(
            raw_metrics=raw,
            predictor_setup_s=built - start,
            simulation_s=done - built,
            predictor_cache_hit=bool(predictor.cache_hit),
            engine_overhead=report,
            engine_overhead_fit=table,
            steps=batch_steps(simulator.metric_store) if request.step_log else None,
        )
        return result if self.note is None else replace(result, event_loop_note=self.note)


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
