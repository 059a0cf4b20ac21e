"""What a simulator is: one frozen :class:`SimulationRequest` in, one :class:`SimulationResult`
out, whichever loop runs it (:class:`Simulator`), and the steps every loop shares.

Three loops implement it, one module each, as Vidur keeps one replica scheduler per module:
Vidur's own ``Simulator.run`` (:mod:`.simulator_vidur`), our aggregate loop that makes Vidur's
decisions batch for batch (:mod:`.simulator_fast`) and vLLM's V1 scheduler, which Vidur has not
(:mod:`.simulator_v1`). :func:`.simulation.simulator_for` picks one per request, in one place.
Every loop starts from the same clean slate (Vidur's entity ids and seeds reset), builds the same
predictor, fits the same engine overhead (:func:`attach_overhead`) and writes the same
``request_metrics.csv`` (:func:`write_raw`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpu_simulate_test.calibration import overhead
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.vidur import DEFAULT_EVENT_LOOP
from gpu_simulate_test.io.artifacts import atomic_open
from gpu_simulate_test.simulator.kv_cache import Segments
from gpu_simulate_test.simulator.types import StepClock, V1Params
from gpu_simulate_test.vidur_simulate.contract import VIDUR_REQUEST_METRICS

if TYPE_CHECKING:
    from vidur.config import SimulationConfig

    from gpu_simulate_test.calibration.serving_load import ServingLoad
    from gpu_simulate_test.simulator.api import FleetSpec
    from gpu_simulate_test.simulator.step_model import StepModel


class ReplayClock(StepClock, Protocol):
    """A :class:`~.vllm_v1.StepClock` from a real run's own steps (an oracle replay's
    :class:`~.oracle.OracleClock`), which reports where its step times came from."""

    def report(self) -> dict[str, Any]:
        """Where the step times came from, for ``run_meta.json``'s ``oracle``."""
        ...


@runtime_checkable
class FleetReplayClock(Protocol):
    """A data-parallel run's own steps, a clock per engine (an oracle replay of a fleet:
    :class:`~.oracle.FleetOracle`)."""

    @property
    def clocks(self) -> Sequence[StepClock]:
        """Engine ``k``'s clock at ``k``."""
        ...

    @property
    def routed_at(self) -> np.ndarray | None:
        """When the router decides for each request (trace order; None: at its arrival)."""
        ...

    @property
    def router_reads(self) -> Sequence[list[tuple[int, float]] | None] | None:
        """What the real client's router read of each engine for each request (trace order;
        None: it read no load, the simulated router reads the simulated engines')."""
        ...

    def report(self) -> dict[str, Any]:
        """Where the step times came from, for ``run_meta.json``'s ``oracle``."""
        ...


@dataclass(frozen=True, eq=False)
class SimulationRequest:
    """Everything one simulation is told: Vidur's config and the knobs on top of it.

    The stage fills it from ``VidurConfig`` (the knobs keep its keys' names) and the bundle's
    calibration; :func:`.simulation.simulator_for` picks the loop from ``v1``, ``event_loop``
    and the config, in one place.
    """

    simulation_config: SimulationConfig
    """Vidur's config (a fresh one per simulation: Vidur mutates it)."""
    engine_steps: pd.DataFrame | None = None
    """One backend's calibration rows (``engine_steps.csv``): the engine's per-step overhead
    is fitted against this predictor and added to every batch (None: Vidur's ops alone)."""
    backend: str = ""
    """The backend ``engine_steps`` calibrated (``vidur.engine_overhead``)."""
    step_jitter: overhead.StepJitter | None = None
    """With ``engine_steps``: every batch's time times a seeded draw from this spread."""
    event_loop: str = DEFAULT_EVENT_LOOP
    """``fast``: ours where it reproduces Vidur, else Vidur's with the lean store (the result
    says why); ``vidur``: Vidur's own."""
    lean_metrics: bool = True
    """Vidur's loop records into the stage's lean store (false: Vidur's own, only with
    ``event_loop=vidur``; a hand-over from ours is always lean)."""
    step_log: bool = True
    """Keep one row per batch (the result's ``steps`` and ``schedule``)."""
    step_time_scale: float = 1.0
    """Every predicted step times this (``vidur.step_time_scale``; not a ``replay_clock``'s)."""
    v1: V1Params | None = None
    """vLLM's V1 scheduler, in our loop (Vidur has none; None: one of Vidur's schedulers)."""
    replay_clock: ReplayClock | FleetReplayClock | None = None
    """vllm_v1: time steps by a real run's own (an oracle replay) instead of the predictor; a
    data-parallel run's, one clock per engine (with ``fleet``)."""
    serving_steps: pd.DataFrame | None = None
    """vllm_v1 with ``engine_steps``: the bundle's calibration replays under load, whose serving
    terms (:class:`~..simulator.step_model.PredictorClock`) apply on top of the predictor."""
    after: Sequence[tuple[int, float]] | None = None
    """vllm_v1: a closed loop (multi-turn sessions), :func:`.vllm_v1.run_v1`'s ``after``; the
    trace's arrivals of the requests sent after another are replaced by the simulated sends."""
    prompt_segments: Sequence[Segments] | None = None
    """vllm_v1 with prefix caching: what each prompt is made of (:mod:`..simulator.kv_cache`;
    None: every prompt its own)."""
    step_model: StepModel | None = None
    """vllm_v1: the step model to time steps with, built once by the caller for many
    simulations (None: built from this request's config and calibration)."""
    fleet: FleetSpec | None = None
    """vllm_v1: replicas behind a router (None or one replica: one engine)."""
    sent_s: np.ndarray | None = None
    """vllm_v1 timed by the step model: when the client sent each request (NaN: not known
    ahead), for the serving terms' intake (None: none)."""
    wake_spread: bool = True
    """vllm_v1 with the serving terms: each wake-up drawn around the curve
    (``vidur.wake_spread``; False: on it)."""
    busy_spread: bool = False
    """vllm_v1 with the serving terms: each busy step's fast spread drawn from its band's
    calibrated steps (``vidur.busy_spread``; False: the lognormal noise)."""
    intake_pause: bool = True
    """vllm_v1 with the serving terms: a busy step that takes in a request pauses as the
    replays' such steps did (``vidur.intake_pause``; False: every busy step the mean pause)."""
    intake_step: bool = True
    """vllm_v1 with the serving terms: a busy step taking a request in adds the replays' such
    steps' extra time (``vidur.intake_step``; False: fitted and simulated without it)."""
    progress: bool = False
    """Draw a progress bar over the requests while our aggregate loop simulates them (the
    stage's ``progress``)."""
    intake_catch: bool = False
    """vllm_v1 timed by the step model, one engine: a step's end waits for the requests the
    API server is taking in (``vidur.intake_catch``; :mod:`..simulator.intake_catch`)."""

    def __post_init__(self) -> None:
        if self.replay_clock is not None and self.step_time_scale != 1.0:
            raise ConfigError(
                f"vidur.step_time_scale={self.step_time_scale} scales predicted steps; an oracle "
                "replay's steps are the engine's own: leave one of the two out"
            )

    @property
    def seed(self) -> int:
        return int(self.simulation_config.seed)

    @property
    def output_dir(self) -> Path:
        """Where Vidur's own files go (``request_metrics.csv`` among them)."""
        return Path(self.simulation_config.metrics_config.output_dir)


@dataclass(frozen=True)
class SimulationResult:
    """What one simulation gives, whichever loop ran it: Vidur's request rows and how they
    were reached (the loop, its timings, the fitted overhead, the batches or steps)."""

    raw_metrics: pd.DataFrame
    """Vidur's ``request_metrics.csv`` rows (also written to the request's output dir)."""
    predictor_setup_s: float
    """Seconds to build (train or load) the predictor and fit the overhead."""
    simulation_s: float
    """Seconds in the event loop."""
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
    serving_fit: tuple[ServingLoad, pd.DataFrame, np.ndarray] | None = None
    """vllm_v1 with the bundle's calibration replays: the fitted
    :class:`~gpu_simulate_test.calibration.serving_load.ServingLoad`, the replays' step features and
    each step's prediction (for the report and ``step_residuals.png``)."""
    prefix_cache: dict[str, int] | None = None
    """vllm_v1 with prefix caching: vLLM's prefix-cache totals (queries and hits, in tokens)."""


class Simulator(Protocol):
    """One event loop: simulates a request from a clean slate and reads its request rows."""

    def run(self, request: SimulationRequest) -> SimulationResult:
        """Simulate ``request``; Vidur's ``request_metrics.csv`` lands in its output dir."""
        ...


def clean_slate(seed: int) -> float:
    """Rewind Vidur's entity ids and seed its random generators; returns the start time."""
    from vidur.utils.random import set_seeds

    from gpu_simulate_test.vidur_simulate.registration import reset_entity_ids

    reset_entity_ids()
    set_seeds(seed)
    return time.perf_counter()


def write_raw(out_dir: Path, requests: pd.DataFrame) -> pd.DataFrame:
    """Vidur's ``request_metrics.csv`` from the rows a lean store or our loop recorded."""
    with atomic_open(out_dir / VIDUR_REQUEST_METRICS) as handle:
        requests.to_csv(handle, index=False, lineterminator="\n")
    return requests


@dataclass(frozen=True)
class FittedOverhead:
    """The engine's per-step overhead fitted against a predictor, with its seeded jitter draws
    (None, None: not modelled) and the fit's report and table."""

    overhead: overhead.StepOverhead | None = None
    draw: Callable[[], float] | None = None
    report: dict[str, Any] | None = None
    table: pd.DataFrame | None = None


def fit_overhead(predictor: Any, request: SimulationRequest) -> FittedOverhead:
    """Fit the engine's per-step overhead against this predictor's ops (reading, not changing
    it), with the seeded jitter draws."""
    if request.engine_steps is None:
        return FittedOverhead()
    jitter = request.step_jitter
    step_overhead, table = overhead.fit(
        request.backend, request.engine_steps, predictor.ops_time_ms
    )
    draw = jitter.sampler(request.seed) if jitter is not None else None
    report = overhead.fit_report(step_overhead, table)
    if jitter is not None:
        report["step_jitter"] = {**asdict(jitter), "mean_ratio": jitter.mean_ratio}
    return FittedOverhead(step_overhead, draw, report, table)


def attach_overhead(
    predictor: Any, request: SimulationRequest
) -> tuple[dict[str, Any] | None, pd.DataFrame | None]:
    """For Vidur's own loop, which calls the predictor itself: fit the engine's per-step
    overhead and attach it (with the seeded jitter draws); returns the fit's report and table."""
    fitted = fit_overhead(predictor, request)
    if fitted.overhead is not None:
        predictor.attach_overhead(fitted.overhead, fitted.draw)
    return fitted.report, fitted.table


def build_predictor(simulation_config: SimulationConfig) -> tuple[Any, Any]:
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


def read_trace(simulation_config: SimulationConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The trace's arrival times and prompt and output tokens, as Vidur's trace reader gives
    them (its clipping and scaling of the token counts), for the loops that are not Vidur's."""
    from vidur.request_generator.trace_replay_request_generator import (
        TraceReplayRequestGenerator,
    )

    trace = TraceReplayRequestGenerator(simulation_config.request_generator_config).trace_df
    return (
        trace["Time"].to_numpy(dtype=float),
        trace["PromptTokenCount"].to_numpy(),
        trace["CompletionTokenCount"].to_numpy(),
    )


def steps_frame(
    ids: npt.ArrayLike,
    size: npt.ArrayLike,
    prefill: npt.ArrayLike,
    decode: npt.ArrayLike,
    elapsed_s: npt.ArrayLike,
) -> pd.DataFrame:
    """Batches as rows of the ``engine_step_log`` table, so they line up with a real engine's
    steps: requests and tokens by phase and the batch's execution time. A decode is one token
    of one request; Vidur counts a one-token prefill chunk as a decode."""
    sizes = np.asarray(size, dtype=np.int64)
    decodes = np.asarray(decode, dtype=np.int64)
    return pd.DataFrame(
        {
            "step_index": np.asarray(ids, dtype=np.int64),
            "time_s": np.full(len(sizes), np.nan),
            "num_prefill_requests": sizes - decodes,
            "num_prefill_tokens": np.asarray(prefill, dtype=np.int64),
            "num_decode_requests": decodes,
            "num_decode_tokens": decodes,
            "elapsed_ms": 1000.0 * np.asarray(elapsed_s, dtype=float),
            "kv_cache_usage_pct": np.full(len(sizes), np.nan),
        }
    )
