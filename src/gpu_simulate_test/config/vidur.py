"""Typed configs of the two Vidur stages: profile a model on a device, simulate a workload."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from omegaconf import MISSING

from gpu_simulate_test.config.backends import BACKEND_NAMES, BackendConfig
from gpu_simulate_test.config.fleet import FleetConfig
from gpu_simulate_test.config.schema import (
    DEFAULT_BLOCK_SIZE,
    ConfigError,
    GoodputConfig,
    HardwareConfig,
    ModelConfig,
    OutputConfig,
    _check,
    _check_choice,
    check_block_size,
)
from gpu_simulate_test.config.vidur_profile import (  # noqa: F401  (re-exported)
    EngineCalibrationConfig,
    ProfileRangesConfig,
    VidurProfileStageConfig,
)
from gpu_simulate_test.io.layout import PROFILING_ROOT

VIDUR_SCHEDULERS: tuple[str, ...] = ("vllm", "sarathi", "orca", "vllm_v1")
"""Vidur's replica schedulers, and ``vllm_v1``: vLLM's V1 scheduler in our event loop
(:mod:`gpu_simulate_test.simulator.run`; Vidur has none)."""
EVENT_LOOPS: tuple[str, ...] = ("fast", "vidur")
"""``fast``: our event loop (:mod:`gpu_simulate_test.vidur_simulate.event_loop`); ``vidur``:
Vidur's own ``Simulator.run``."""
DEFAULT_EVENT_LOOP = "fast"
"""The event loop a simulation runs on unless told otherwise (the config's and the library's)."""


SEED_RANGE = 2**32
"""Vidur's and numpy's seeds: 0 .. 2**32 - 1 (``vidur.seed``)."""


def derived_seed(seed: int, k: int) -> int:
    """The ``k``-th seed after ``seed`` (``capacity.sim_seeds``, ``tune.sim_seeds``, the
    pipeline's seeds), wrapping within :data:`SEED_RANGE`: ``vidur.seed=4294967295`` with three
    noise seeds runs 4294967295, 0 and 1 (it refused the second mid-run)."""
    return (seed + k) % SEED_RANGE


@dataclass(frozen=True)
class VidurSchedulerConfig:
    """Vidur replica-scheduler knobs (sarathi mirrors transformers' continuous batching)."""

    name: str = "sarathi"
    """vllm, sarathi or orca (Vidur's), or vllm_v1: vLLM's V1 scheduler in our event loop
    (token budget ``chunk_size``, ``batch_size_cap`` requests, preemption by recompute when the
    KV blocks run out), what the ``vllm`` backends are simulated with."""
    batch_size_cap: int = 32
    """Most requests in one batch (hf_cb ``max_requests_per_batch``)."""
    chunk_size: int = 512
    """sarathi: token budget per batch, prefill chunked to fit (hf_cb ``max_batch_tokens``)."""
    max_tokens_in_batch: int = 4096
    """vllm: token budget per batch."""
    block_size: int = DEFAULT_BLOCK_SIZE
    """KV-cache block size in tokens (hf_cb ``page_size``)."""
    num_blocks: int = 0
    """KV-cache blocks; 0 derives them from device memory and Qwen3's true KV bytes per token."""
    watermark_blocks_fraction: float = 0.01
    """Fraction of blocks kept free when admitting new requests."""
    memory_margin_fraction: float = 0.1
    """Fraction of device memory kept free when deriving num_blocks."""
    enable_prefix_caching: bool = False
    """vllm_v1 only: vLLM's automatic prefix caching, block for block (``backend.
    enable_prefix_caching`` of a vLLM backend). Vidur's own schedulers do not model it."""
    enable_chunked_prefill: bool = True
    """vllm_v1: vLLM's chunked prefill (``backend.enable_chunked_prefill``); off, a waiting
    prompt is scheduled only whole, within what is left of the step's token budget. Vidur's
    sarathi always chunks."""

    def __post_init__(self) -> None:
        _check_choice("vidur.scheduler.name", self.name, VIDUR_SCHEDULERS)
        _check(
            self.enable_chunked_prefill or self.name == "vllm_v1",
            "vidur.scheduler.enable_chunked_prefill=false needs vidur.scheduler.name=vllm_v1: "
            f"Vidur's {self.name} scheduler always chunks",
        )
        _check(
            not self.enable_prefix_caching or self.name == "vllm_v1",
            "vidur.scheduler.enable_prefix_caching=true needs vidur.scheduler.name=vllm_v1: "
            f"Vidur's {self.name} scheduler does not model prefix caching",
        )
        for name in ("batch_size_cap", "chunk_size", "max_tokens_in_batch"):
            _check(getattr(self, name) >= 1, f"vidur.scheduler.{name} must be >= 1")
        check_block_size("vidur.scheduler.block_size", self.block_size)
        _check(self.num_blocks >= 0, "vidur.scheduler.num_blocks must be >= 0")
        for name in ("watermark_blocks_fraction", "memory_margin_fraction"):
            value = getattr(self, name)
            _check(0 <= value < 1, f"vidur.scheduler.{name} must be in [0, 1), got {value}")


@dataclass(frozen=True)
class VidurPredictorConfig:
    """Vidur's random-forest execution-time predictor, sized for small machines."""

    num_estimators: int = 32
    """Trees per forest (one grid point; Vidur's default grid is 27 points x 10 folds)."""
    max_depth: int = 16
    min_samples_split: int = 2
    k_fold_cv_splits: int = 2
    kv_cache_prediction_granularity: int = 64
    """KV-cache sizes are rounded up to a multiple of this for attention lookups (tokens)."""
    prefill_chunk_granularity: int = 32
    """Prefill chunks are rounded up to a multiple of this; fixed at 32 in Vidur 0.0.26."""
    num_training_job_threads: int = 2
    cache_dir: str = "tmp/vidur_cache"
    """Trained predictors, keyed by a fingerprint of the bundle, model and these settings."""
    no_cache: bool = False
    """Retrain and re-predict even when the cache holds this fingerprint."""

    def __post_init__(self) -> None:
        for name in (
            "num_estimators",
            "max_depth",
            "k_fold_cv_splits",
            "num_training_job_threads",
            "kv_cache_prediction_granularity",
        ):
            _check(getattr(self, name) >= 1, f"vidur.predictor.{name} must be >= 1")
        _check(self.min_samples_split >= 2, "vidur.predictor.min_samples_split must be >= 2")
        _check(self.k_fold_cv_splits >= 2, "vidur.predictor.k_fold_cv_splits must be >= 2")
        _check(
            self.prefill_chunk_granularity == 32,
            "vidur.predictor.prefill_chunk_granularity must be 32 (hard-coded in Vidur 0.0.26), "
            f"got {self.prefill_chunk_granularity}",
        )


_CHUNKED: Mapping[str, str] = MappingProxyType(
    {
        "name": "backend.name",
        "chunk_size": "backend.max_num_batched_tokens (vLLM's --max-num-batched-tokens)",
        "batch_size_cap": "backend.max_num_seqs (vLLM's --max-num-seqs)",
        "block_size": "backend.block_size (vLLM's --block-size)",
        "num_blocks": "backend.num_gpu_blocks_override (vLLM's --num-gpu-blocks-override)",
    }
)
_VLLM: Mapping[str, str] = MappingProxyType(
    {
        **_CHUNKED,
        "enable_prefix_caching": "backend.enable_prefix_caching",
        "enable_chunked_prefill": "backend.enable_chunked_prefill",
    }
)
DERIVED_SCHEDULER: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "hf_cb": _CHUNKED,
        "vllm": _VLLM,
        "vllm_engine": _VLLM,
        "hf_generate": MappingProxyType(
            {"name": "backend.name", "batch_size_cap": "backend.name (one at a time)"}
        ),
    }
)
"""Per backend, the Vidur scheduler knobs an orchestrator (pipeline, fidelity, capacity) derives
from the engine's own, and the knob each is derived from: the engine's knob is the one name to
set (``orchestrate``'s ``derive_scheduler`` does the deriving; a test holds the two equal)."""


def check_scheduler_named_once(backend: BackendConfig, scheduler: VidurSchedulerConfig) -> None:
    """ConfigError naming each ``vidur.scheduler.*`` knob set (away from its default) that the
    orchestrators derive from ``backend``'s own knob, with the knob to set instead: one name per
    knob."""
    default = VidurSchedulerConfig()
    derived = DERIVED_SCHEDULER.get(backend.name, {})
    twice = [
        f"vidur.scheduler.{name}={getattr(scheduler, name)!r} (derived from {source})"
        for name, source in derived.items()
        if getattr(scheduler, name) != getattr(default, name)
    ]
    _check(
        not twice,
        f"with backend={backend.name} the simulator's scheduler is derived from the engine's "
        f"knobs, so these are set twice: {'; '.join(twice)}; set the engine's knob instead (one "
        "name per knob; vidur_simulate alone takes vidur.scheduler.*)",
    )


FRONTEND_INPUTS: tuple[str, ...] = ("line", "queue")
"""``vidur.frontend_input``'s models of a request's way in to the engine."""


@dataclass(frozen=True)
class VidurConfig:
    """Everything the simulator is told besides the model, device and workload.

    ``event_loop`` picks the loop; ``lean_metrics`` the metrics store Vidur's loop records into
    (ours records its own, and hands over to Vidur's with the lean store). Vidur's full store
    (``lean_metrics=false``) exists only on Vidur's loop: with ``event_loop=fast`` it is refused,
    never a silent switch of loops.

    Five fields choose how the simulation runs, not what it simulates (the same request rows
    whichever way; :mod:`gpu_simulate_test.vidur_simulate.simulation` picks the loop):

    ================  =========================  ===============  =========================
    field             Vidur's loop               our loop         ``scheduler.name=vllm_v1``
    ================  =========================  ===============  =========================
    ``event_loop``    ``vidur``                  ``fast``         ``fast`` only
    ``lean_metrics``  its metrics store          (its own rows)   (its own rows)
    ``step_log``      ``engine_step_log.csv``    the same         and ``engine_schedule.csv``
    ``chrome_trace``  Vidur's trace              hands over to    refused (Vidur's events)
                                                 Vidur's loop
    ================  =========================  ===============  =========================

    ``fast_path`` is none of them: the old name of ``lean_metrics``, refused naming the new key.
    """

    scheduler: VidurSchedulerConfig = field(default_factory=VidurSchedulerConfig)
    predictor: VidurPredictorConfig = field(default_factory=VidurPredictorConfig)
    engine_overhead: str = "none"
    """Add the per-step cost the bundle's engine calibration measured for this backend
    (``hf_cb``, ``hf_generate``, ...) to every simulated batch; ``none`` simulates the
    profiled ops alone (Vidur's own model)."""
    step_jitter: bool = False
    """Multiply every simulated step by a factor drawn (seeded by ``seed``) from the spread of
    the calibrated decode steps around their median (meta.json
    ``engine_calibration.<backend>.step_jitter``); needs ``engine_overhead``."""
    serving_load: bool = True
    """With ``engine_overhead`` and ``scheduler.name=vllm_v1``, apply the serving terms fitted on
    the bundle's calibration replays under load (``serving_steps.csv``; a bundle without them
    simulates as before): a step stretched by the requests taken in per second, a pause between
    busy steps, and waking an idle engine after that long idle."""
    serving_intake: bool = True
    """With ``serving_load``: a request the client sends while a step runs adds the intake the
    calibration replays measured to that step (the API server takes it in on the engine's cores;
    ``serving_steps.csv`` ``client_sends``), and the rates' stretch is fitted without it; from
    calibration 17 only a send past the step's free part (:mod:`~..calibration.intake_phase`),
    before it (12 to 16) wherever it falls. On by default since 2026-12-04 (three campaigns:
    client TTFT p50 at 20% within 10% at level 3 of 3, 0 of 3 without; main jobs moved both ways;
    benchmarks/results/intake_phase_20261204)."""
    intake_pause: bool = True
    """With ``serving_load``: the pause before a busy step that takes in a request is the
    calibration replays' own for such steps (vLLM's engine core stamps the request queued
    between two steps; recorded before calibration 21, the step that scheduled it started
    about a millisecond later in about half of them, most of it our step record's own write
    there), the pause before the others theirs
    (:attr:`~..calibration.serving_load.ServingLoad.intake_gap_ms`); false: one mean pause
    before every busy step, the intake's spread over all of them. On by default since
    2026-12-06 (twenty main jobs and three campaigns re-simulated: client TTFT p50 / p90 mean
    signed −1.3 / −3.6% → −0.4 / −0.7%, engine TTFT p50 −6.3 → −4.2%; at the runs' level the
    campaigns' pooled median and largest error lower on TTFT, TPOT and E2E;
    benchmarks/results/intake_pause_20261206)."""
    intake_step: bool = True
    """With ``serving_load``: a busy step that schedules a request for the first time adds what
    the calibration replays' such steps took beyond the others (vLLM's engine core sets the new
    request up in that step: its blocks, its row in the input batch; 0.18 ms at the median of
    twenty calibrations on this host, 0.25 on average),
    and the rates' stretch is fitted without it
    (:attr:`~..calibration.serving_load.ServingLoad.intake_step_ms`,
    :mod:`~..calibration.intake_step`); false: every busy step the rate's stretch alone. On by
    default since 2026-12-06 (benchmarks/results/intake_step_20261206)."""
    intake_catch: bool = False
    """With ``scheduler.name=vllm_v1`` on one engine: a step whose end falls while the API
    server is taking a request in (after its send, before it reaches the engine) ends when the
    request reaches the engine, and the request is taken in there
    (:mod:`~gpu_simulate_test.simulator.intake_catch`: the engine core shares its core with the
    API server and cannot close the step before the intake lets it)."""
    frontend_latency: bool = True
    """With ``engine_overhead``, delay every request's arrival at the scheduler and every
    token's delivery by the front end's latency the calibration measured (meta.json
    ``engine_calibration.<backend>.frontend``: vLLM's HTTP server, tokenization and output
    stream); calibrations without it simulate none."""
    frontend_queue: bool = True
    """With ``frontend_latency``, ``scheduler.name=vllm_v1`` and ``step_log``: the tokens' way
    back to the client as a queue (vLLM's API server as one server: work per request sent, per
    step and per token streamed; meta.json ``engine_calibration.<backend>.frontend.queue``,
    fitted on the calibration replays under load) instead of one constant delay. The client's
    clock only: when a request reaches the engine is the same either way."""
    frontend_input: str = "line"
    """How long a request takes from its send to the engine's scheduler (with
    ``frontend_latency``). ``line``: the calibrated line in the requests in flight at its send.
    ``queue``: the input a quiet client measured (the calibration's experiments), plus the wait
    behind the API server's other work, as the queue of ``frontend_queue`` serves it (the other
    requests' input, each step's stream work); one engine, ``vllm_v1``, a bundle with both
    readings. Not the default: on five main jobs it was worse, on a fidelity campaign better
    (benchmarks/results/main_job_ttft_20261203)."""
    frontend_input_spread: bool = False
    """With ``frontend_input=line``: each way in is the line plus a seeded draw from the
    replays' hops around it at its load (``frontend.input_residual_ms``). Off: at 50-85% of
    capacity it made the too-long front end longer (results/main_job_spread_20261203)."""
    frontend_idle_spread: bool = True
    """With ``frontend_input=line``: each request sent to an idle engine (none in flight) draws
    its way in from the calibration's idle sends around ``input_idle_ms``
    (``frontend.input_residual_ms``'s bucket 0) and, from calibration version 16 on, its first
    token's way back from those sends' first tokens around the queue's
    (``frontend.queue.first_idle_residual_ms``), each seeded by ``seed``. An idle engine stamps
    a request on arrival: read exactly (a busy engine's hop only within the step in progress);
    a bundle without them says why in ``run_meta.json``."""
    frontend_busy_spread: bool = True
    """A request sent to a busy engine draws its first token's way back beyond the queue's from
    the replays' first tokens sent with as many in flight (``frontend.queue.
    first_busy_residual_ms``, version 18 on), seeded by ``seed``; off: the queue's mean."""
    frontend_busy_hop: bool = True
    """With ``frontend_input=line``: each request sent to a busy engine (others in flight) draws
    its way in around the line from the calibration replays' busy sends, their hops estimated
    through the engine's steps (``frontend.busy_hop_residual_ms``, version 19 on;
    :mod:`~..calibration.busy_hop`), seeded by ``seed``: a hop longer than the step in
    progress's remainder misses that step's end as often as the replays' did. Not drawn with
    ``frontend_input_spread`` (which spreads every send by the windows' middles instead), with
    ``frontend_input=queue`` or in a closed loop (multi-turn sessions)."""
    frontend_spread_tail: bool = False
    """Every front-end spread drawn above (the way in, a busy send's hop, the first token's way
    back) read beyond its 99th percentile on an exponential tail through its 95th and 99th
    (:func:`~..calibration.input_spread.read_quantiles`); false: at most its 99th percentile."""
    wake_spread: bool = True
    """A step that wakes an idle engine adds one of the calibration replays' wake-ups beyond
    the curve, seeded by ``seed`` (:mod:`~..calibration.wake`; false: on the curve)."""
    busy_spread: bool = False
    """A busy step's fast spread drawn from the calibration's busy steps of its band of decodes,
    right tail and stalls included, seeded (:mod:`~..calibration.busy_spread`; false: the
    lognormal noise)."""
    step_time_scale: float = 1.0
    """Every simulated step takes this many times its calibrated time (the pause between busy
    steps too): a what-if for a slower (> 1) or faster (< 1) host or device, and how the capacity
    stage asks what a step-time error would do to its answer (``capacity.step_band``). 1: as
    calibrated."""
    frontend_time_scale: float = 1.0
    """Every calibrated front-end cost (the way in, its spreads, the API server's queue, the way
    back) takes this many times its time (:mod:`~..calibration.frontend_scale`): the simulation
    at a real run's own step level sets it to the level where the engine runs on the host's CPU,
    whose cores the API server shares. 1: as calibrated."""
    seed: int = 42
    chrome_trace: bool = False
    """Vidur's chrome trace (large and slow): off by default."""
    event_loop: str = DEFAULT_EVENT_LOOP
    """``fast``: our event loop, which makes Vidur's scheduling decisions batch for batch and
    gives the same ``request_metrics.csv`` to the bit, many times faster (one replica, one
    stage; it hands over to Vidur's loop where it cannot follow, e.g. KV-cache preemption);
    ``vidur``: Vidur's own ``Simulator.run``."""
    step_log: bool = True
    """Write ``engine_step_log.csv``, one row per simulated batch (compare's step-level
    comparison reads it). A million requests make tens of millions of rows: large runs, and the
    capacity search's simulations, go without."""
    lean_metrics: bool = True
    """Whenever Vidur's loop runs: record only what the stage reads instead of Vidur's full
    metrics store (the same ``request_metrics.csv`` to the bit, about a sixth less time); false
    keeps Vidur's own store and the CSVs and plots it writes under ``vidur/``. Only Vidur's loop
    fills that store, so false needs ``event_loop=vidur`` (refused with ``fast``)."""
    fast_path: bool | None = None
    """Renamed ``lean_metrics``: any value is refused with a message naming the new key."""

    def __post_init__(self) -> None:
        _check(
            self.fast_path is None,
            f"vidur.fast_path={self.fast_path} is now vidur.lean_metrics (the lean metrics store; "
            "the event loop is vidur.event_loop): set vidur.lean_metrics instead",
        )
        _check(
            math.isfinite(self.step_time_scale) and self.step_time_scale > 0,
            f"vidur.step_time_scale={self.step_time_scale} must be a positive factor (1: every "
            "step as calibrated)",
        )
        _check(
            math.isfinite(self.frontend_time_scale) and self.frontend_time_scale > 0,
            f"vidur.frontend_time_scale={self.frontend_time_scale} must be a positive factor (1: "
            "the front end as calibrated)",
        )
        _check(
            0 <= self.seed < SEED_RANGE,
            f"vidur.seed={self.seed} must be a whole number from 0 to 2**32 - 1 (Vidur's and "
            "numpy's seed range)",
        )
        _check_choice("vidur.engine_overhead", self.engine_overhead, ("none", *BACKEND_NAMES))
        _check_choice("vidur.event_loop", self.event_loop, EVENT_LOOPS)
        _check_choice("vidur.frontend_input", self.frontend_input, FRONTEND_INPUTS)
        _check(
            self.lean_metrics or self.event_loop == "vidur",
            "vidur.lean_metrics=false keeps Vidur's own metrics store, which only Vidur's loop "
            f"fills; with vidur.event_loop={self.event_loop} pass vidur.event_loop=vidur too",
        )


@dataclass(frozen=True)
class VidurSimulateStageConfig:
    """``vidur_simulate``: replay a workload run in Vidur with a local profiling bundle."""

    model: ModelConfig = MISSING
    hardware: HardwareConfig = MISSING
    vidur: VidurConfig = field(default_factory=VidurConfig)
    workload_dir: str = MISSING
    """The workload run to replay (``tmp/workload/<run_id>``)."""
    profiling_root: str = PROFILING_ROOT
    """Where ``vidur_profile`` put bundles: ``<profiling_root>/<hardware.name>/<model.name>/``."""
    step_times_from: str | None = None
    """Oracle replay: a ``real_bench`` run of the same workload on a ``vllm`` backend whose own
    steps time the simulation (:mod:`gpu_simulate_test.vidur_simulate.oracle`): requests reach the
    scheduler when that engine queued them, each step lasts what the engine's step of the same
    position took (else of the same composition). The scheduler (``vllm_v1``) and its knobs are
    the run's own (``run_meta.json``); one given that contradicts them is refused. The engine
    overhead, jitter and front-end model are not used (the run's own times are)."""
    arrivals_from: str | None = None
    """A ``real_bench`` run of the same workload whose actual arrival times (when the client
    really sent each request) replace the scheduled ones; requests it did not send keep theirs."""
    goodput: GoodputConfig = field(default_factory=GoodputConfig)
    """Goals per request (ms) for ``request_goodput``, as ``vllm bench serve --goodput``:
    ``goodput.ttft=500 goodput.tpot=50 goodput.e2el=1000`` (any subset; none: not reported)."""
    fleet: FleetConfig = field(default_factory=FleetConfig)
    """``fleet.replicas=N fleet.router=...``: N engines behind a router (``vllm_v1`` only)."""
    output: OutputConfig = field(default_factory=OutputConfig)
    progress: bool = True

    def __post_init__(self) -> None:
        if not self.workload_dir:
            raise ConfigError("workload_dir is required: pass workload_dir=tmp/workload/<run_id>")
        if self.fleet.replicas > 1:
            _check(  # an oracle replay takes its scheduler from the run (vllm_v1)
                self.vidur.scheduler.name == "vllm_v1" or bool(self.step_times_from),
                f"fleet.replicas={self.fleet.replicas} simulates vLLM engines: set "
                f"vidur.scheduler.name=vllm_v1 (not {self.vidur.scheduler.name})",
            )
        if self.step_times_from:
            # the scheduler and its knobs come from the run (vidur_simulate/real_run.py)
            _check(
                self.vidur.step_time_scale == 1.0,
                f"step_times_from={self.step_times_from} replays the engine's own step times; "
                f"vidur.step_time_scale={self.vidur.step_time_scale} would change them: leave "
                "one of the two out",
            )
            _check(
                self.vidur.frontend_time_scale == 1.0,
                f"step_times_from={self.step_times_from} replays the engine's own clock, without "
                f"the front end: vidur.frontend_time_scale={self.vidur.frontend_time_scale} "
                "would do nothing: leave it out",
            )
            _check(
                not self.arrivals_from,
                "step_times_from takes the arrivals from the same run (when its engine queued "
                "each request): leave arrivals_from out",
            )
