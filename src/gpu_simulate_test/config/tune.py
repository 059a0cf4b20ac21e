"""Typed config of the ``tune`` stage: vLLM's engine knobs searched by simulation for the best
configuration under latency goals, and the best few confirmed on the real engine.

The goals, the rates the simulated search may try and the real search's sizing are the capacity
stage's keys (``capacity.*``: ``slo``, ``qps_min``/``qps_max``, ``verify_*``), the ones a tune
reads (:class:`~gpu_simulate_test.config.search.SearchOptions`); the space, the objective and the
confirmation are ``tune.*``. The simulator's scheduler is each configuration's own (derived from
its knobs); ``vidur.*`` holds the few simulator settings a tune reads besides
(:class:`TuneSimulatorConfig`), and the profile's and the real bench's settings are the tune's
in code (:data:`TUNE_PROFILE`, the pipeline's defaults)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpu_simulate_test.config.capacity import CapacityOptions, CapacityStageConfig
from gpu_simulate_test.config.fleet import FLEET_ROUTERS
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import ConfigError, _check
from gpu_simulate_test.config.search import SearchOptions, SearchStageBase
from gpu_simulate_test.config.vidur import (
    ProfileRangesConfig,
    VidurConfig,
    VidurPredictorConfig,
)

TUNE_KNOBS: Mapping[str, str] = MappingProxyType(
    {
        "max_num_seqs": "max_num_seqs",
        "max_num_batched_tokens": "max_num_batched_tokens",
        "enable_chunked_prefill": "enable_chunked_prefill",
        "num_gpu_blocks_override": "num_gpu_blocks_override",
        "enable_prefix_caching": "enable_prefix_caching",
    }
)
"""A knob of the space, named as ``vllm serve`` names it (``--max-num-seqs`` ...) → the backend
field it sets (``backend.*``)."""
FLEET_KNOBS: tuple[str, ...] = ("replicas", "router")
"""The fleet's knobs beside the engine's: ``replicas`` (engines, one GPU each) and ``router``
(:data:`~gpu_simulate_test.config.fleet.FLEET_ROUTERS`), as ``fleet.*`` names them."""
BOOLEAN_KNOBS: tuple[str, ...] = ("enable_chunked_prefill", "enable_prefix_caching")
OBJECTIVES: tuple[str, ...] = ("capacity", "goodput")
TUNE_VERIFY: tuple[str, ...] = ("false", "top_k", "grid")
TUNE_RECALIBRATE: tuple[str, ...] = ("auto", "always", "off")
TUNE_EXECUTORS: tuple[str, ...] = ("local", "ray")


def knob_values(name: str, given: Any) -> tuple[Any, ...]:
    """One knob's values from the config: a list (``[8, 16, 32]``), one value, or a range
    written ``lo:hi:xF`` (geometric: lo, lo·F, ... up to hi) or ``lo:hi:+S`` (lo, lo+S, ...);
    ConfigError naming ``tune.space.<name>`` otherwise."""
    where = f"tune.space.{name}"
    if name not in TUNE_KNOBS and name not in FLEET_KNOBS:
        raise ConfigError(
            f"{where}: not a knob of vLLM's engine or of the fleet that the tune searches; the "
            "knobs are " + ", ".join((*TUNE_KNOBS, *FLEET_KNOBS))
        )
    if isinstance(given, str) and ":" in given:
        values: list[Any] = list(_range(where, given))
    elif isinstance(given, list | tuple):
        values = list(given)
    else:
        values = [given]
    if not values:
        raise ConfigError(f"{where}: an empty list; give at least one value (or leave it out)")
    out = []
    for value in values:
        if name == "router":
            if value not in FLEET_ROUTERS:
                raise ConfigError(
                    f"{where}: {value!r} is not a router; the routers are "
                    + ", ".join(FLEET_ROUTERS)
                )
        elif name in BOOLEAN_KNOBS:
            if not isinstance(value, bool):
                raise ConfigError(f"{where}: {value!r} is not true or false")
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{where}: {value!r} is not a positive whole number")
        if value not in out:
            out.append(value)
    return tuple(out)


def _range(where: str, text: str) -> list[int]:
    parts = text.split(":")
    try:
        if len(parts) != 3 or parts[2][:1] not in ("x", "+"):
            raise ValueError(text)
        low, high, step = int(parts[0]), int(parts[1]), float(parts[2][1:])
    except ValueError:
        raise ConfigError(
            f"{where}={text!r}: a range is lo:hi:xF (geometric) or lo:hi:+S (arithmetic), "
            "e.g. 8:64:x2 or 64:512:+64"
        ) from None
    growing = step > 1 if parts[2][0] == "x" else step >= 1
    if low < 1 or high < low or not growing:
        raise ConfigError(f"{where}={text!r}: needs 1 <= lo <= hi and a step that grows")
    values, value = [], float(low)
    while value <= high + 1e-9:
        values.append(round(value))
        value = value * step if parts[2][0] == "x" else value + step
    return values


@dataclass(frozen=True)
class TuneOptions:
    """The space, the objective and the confirmation on the real engine."""

    space: dict[str, Any] = field(default_factory=dict)
    """Knob (``vllm serve``'s name: max_num_seqs, max_num_batched_tokens,
    enable_chunked_prefill, num_gpu_blocks_override, enable_prefix_caching; the fleet's: replicas,
    router) → a list of values, or a range ``lo:hi:xF`` / ``lo:hi:+S``. Every combination is
    one configuration (one replica needs no router: it is listed once); a knob left out keeps
    the backend's value (``backend.*``; one replica, or ``backend.data_parallel_size`` behind
    ``vllm_dp``; a knob set to None likewise). Empty here: ``tune.yaml`` gives the default
    space, naming every knob (those it does not search as null, so that
    ``tune.space.<knob>=[...]`` needs no ``+``; a key can be dropped with
    ``~tune.space.<knob>``), and the stage refuses an empty one before it starts."""
    objective: str = "capacity"
    """``capacity``: the highest rate that meets ``capacity.slo`` (requests/s); ``goodput``:
    the requests per second that meet every goal at ``tune.qps``."""
    qps: float = 0.0
    """``objective=goodput``: the rate every configuration is simulated at."""
    target_qps: float = 0.0
    """How many GPUs for this rate: the answer is the configuration with the fewest GPUs
    (replicas) whose simulated capacity meets the goals at this rate (the most headroom among
    those), with its ``vllm serve`` command and router; 0: the highest capacity answers."""
    sim_step: float = 1.5
    """The simulated search of each configuration: from the configured backend's capacity,
    up or down by this factor until a pass and a miss bracket the knee, ..."""
    sim_bracket: float = 0.05
    """... then bisection until high / low <= 1 + this."""
    sim_seeds: int = 3
    """Each configuration searched under this many noise seeds (``vidur.seed``, +1, ...), the
    later ones from the first's answer; its answer is the median seed's, every seed's capacity
    beside it (``tune.csv`` ``capacity_seed_low_qps`` / ``_high_qps``). Near the knee one seed
    moves a capacity by several percent (the simulated steps' slow moments and stalls). 1: one."""
    verify: str = "top_k"
    """``top_k``: the best ``top_k`` configurations, the configured one and (with
    ``target_qps``) the answer, each on a real server of its own, rates bracketing the
    simulated capacity (``verify_margin``); ``grid``: the capacity stage's whole real search on
    every configuration; ``false``: simulation only."""
    top_k: int = 3
    verify_margin: float = 0.15
    """``top_k``: the real search starts at the simulated capacity and steps by 1 + this, then
    bisects to it: a right prediction costs two rates (meets just below, misses just above)."""
    server_spread: float = 0.35
    """How far apart two servers' measured capacities may be and still be a tie: the check
    names no winner among configurations whose measured capacity is within this share of the
    best's (the best at most 1 + this times theirs; ``verify.tied_best``). The default is this
    host's, rounded up: two fresh vLLM servers of the same engine (prefix caching on and off, no
    shared prefixes, steps at 0.96–0.99× the model) measured 58.9 and 77.9 req/s, the best
    1.32× the other, in one tune on 2 CPU cores; on a GPU set it from repeats of one
    configuration."""
    verify_budget_s: float = 0.0
    """Wall seconds each configuration's real search may take (0: the capacity stage's
    ``capacity.verify_budget_s``)."""
    servers_at_once: int = 4
    """``top_k``: the checked configurations' servers start this many together, and only while
    nothing is measured (a start is mostly one core importing vLLM into three processes, about
    35 s on 2 CPU cores): then each is measured alone, the others paused (SIGSTOP), and its
    server stopped after its check; the configured backend's starts while the space is
    simulated. A paused server holds its memory (about 3.5 GB for the tiny model on CPU) and no
    core. 1: one at a time, as vLLM's ``auto_tune`` and ``tune.verify=grid`` do."""
    server_stagger_s: float = 10.0
    """``top_k``: seconds between two launches of the servers started together: vLLM on CPU
    pins each server's worker to the engine's core while it imports (``GOMP_CPU_AFFINITY``),
    so workers launched at once import one after another on that core while the other idles;
    launched this far apart, one server's worker imports while the next imports its front end
    and engine core. 0: all at once."""
    calibrations: int = 1
    """How many calibrations, each on a fresh server, the space is simulated with; the tune
    answers with the median one (:mod:`gpu_simulate_test.tune.calibrations`). The first bundle
    is ``profiling_root``'s, the others ``<profiling_root>/calibrations/<i>``, each made once
    and reused. One calibration samples the host's speed once: on a noisy host 3 narrow the
    answer's spread, for the minutes of two more calibrations (once) and two more simulations
    of the space (every tune)."""
    recalibrate: str = "auto"
    """``auto``: when every checked server ran more than 8% off the calibration on the same side
    (``verify.calibration_speed``), calibrate once more on a fresh server (into the run's
    ``recalibration/``), time the checked servers' recorded steps against it, and when they are
    closer to it, simulate the space again with it and answer with that (``tune.json``
    ``recalibration``); ``always``: the same after every check (a bundle suspected stale);
    ``off`` (or false): never."""

    workers: int = 0
    """Processes the simulated search runs in side by side (``executor=local``): 0, one per
    core; 1, this process only. With fleets in the space, a few engine configurations with
    their fleets are a task (:func:`~gpu_simulate_test.tune.simulate.simulate_space`); the
    answer is the same for any count."""
    executor: str = "local"
    """``local``: the tasks in this machine's processes (``workers``); ``ray``: as Ray tasks on
    the cluster at ``ray_address`` (empty: a local one started for the tune; Ray is the optional
    extra ``[ray]``), whose workers read the bundle and workload by the same paths."""
    ray_address: str = ""
    """``executor=ray``: the cluster (``ray://head:10001``, ``auto``); empty: a local one."""

    def __post_init__(self) -> None:
        _check(isinstance(self.space, Mapping), "tune.space must be a mapping of knob: values")
        _check(
            isinstance(self.workers, int) and not isinstance(self.workers, bool)
            and self.workers >= 0,
            f"tune.workers={self.workers!r} must be a whole number >= 0 (0: one per core)",
        )  # fmt: skip
        _check(
            self.executor in TUNE_EXECUTORS,
            f"tune.executor={self.executor!r} must be one of {', '.join(TUNE_EXECUTORS)}",
        )
        _check(
            self.executor == "ray" or not self.ray_address,
            f"tune.ray_address={self.ray_address!r} is a Ray cluster: set tune.executor=ray",
        )
        self.knobs(allow_empty=True)  # each knob's values checked, naming it
        _check(
            self.objective in OBJECTIVES,
            f"tune.objective={self.objective!r} must be one of {', '.join(OBJECTIVES)}",
        )
        _check(
            self.objective != "goodput" or (math.isfinite(self.qps) and self.qps > 0),
            f"tune.objective=goodput needs tune.qps=<the rate to judge goodput at> (got "
            f"{self.qps})",
        )
        mode = {"true": "top_k", "false": "false"}.get(str(self.verify).lower(), self.verify)
        _check(
            mode in TUNE_VERIFY,
            f"tune.verify={self.verify!r} must be one of {', '.join(TUNE_VERIFY)}",
        )
        object.__setattr__(self, "verify", mode)
        _check(
            isinstance(self.servers_at_once, int) and self.servers_at_once >= 1,
            f"tune.servers_at_once={self.servers_at_once!r} must be a whole number >= 1",
        )
        _check(
            math.isfinite(self.server_stagger_s) and 0 <= self.server_stagger_s <= 120,
            f"tune.server_stagger_s={self.server_stagger_s} must be seconds from 0 to 120",
        )
        _check(
            isinstance(self.calibrations, int) and 1 <= self.calibrations <= 9,
            f"tune.calibrations={self.calibrations!r} must be a whole number from 1 to 9",
        )
        again = {"true": "auto", "false": "off"}.get(str(self.recalibrate).lower())
        again = again or str(self.recalibrate)
        _check(
            again in TUNE_RECALIBRATE,
            f"tune.recalibrate={self.recalibrate!r} must be one of {', '.join(TUNE_RECALIBRATE)}",
        )
        object.__setattr__(self, "recalibrate", again)
        _check(
            self.objective == "capacity" or mode == "false",
            "tune.verify confirms capacities: with tune.objective=goodput set tune.verify=false",
        )
        _check(self.top_k >= 1, f"tune.top_k={self.top_k} must be >= 1")
        _check(
            math.isfinite(self.target_qps) and self.target_qps >= 0,
            f"tune.target_qps={self.target_qps} must be a rate >= 0 (0: no target)",
        )
        _check(
            self.objective == "capacity" or not self.target_qps,
            "tune.target_qps asks for the fewest GPUs whose capacity meets the goals: set "
            "tune.objective=capacity",
        )
        _check(
            isinstance(self.sim_seeds, int) and not isinstance(self.sim_seeds, bool)
            and self.sim_seeds >= 1,
            f"tune.sim_seeds={self.sim_seeds} must be a whole number >= 1 (noise seeds per "
            "configuration)",
        )  # fmt: skip
        for name in ("sim_step",):
            value = getattr(self, name)
            _check(math.isfinite(value) and value > 1, f"tune.{name}={value} must be > 1")
        _check(
            math.isfinite(self.server_spread) and 0 <= self.server_spread < 1,
            f"tune.server_spread={self.server_spread} must be in [0, 1) (0: no tie)",
        )
        for name in ("sim_bracket", "verify_margin"):
            value = getattr(self, name)
            _check(math.isfinite(value) and 0 < value < 1, f"tune.{name}={value} must be in (0, 1)")
        _check(
            math.isfinite(self.verify_budget_s) and self.verify_budget_s >= 0,
            f"tune.verify_budget_s={self.verify_budget_s} must be >= 0 (0: capacity's budget)",
        )

    def knobs(self, allow_empty: bool = False) -> dict[str, tuple[Any, ...]]:
        """Each knob of the space and its values, in the order given, a knob set to None (null:
        named so that an override needs no ``+``) left out; ConfigError when empty (no engine
        knob, and no fleet knob with more than one value)."""
        found = {
            str(name): knob_values(str(name), given)
            for name, given in self.space.items()
            if given is not None
        }
        _check(
            allow_empty
            or any(name in TUNE_KNOBS or len(values) > 1 for name, values in found.items()),
            "tune.space is empty: name at least one knob and its values, e.g. "
            "tune.space.max_num_seqs=[8,16,32] or tune.space.replicas=[1,2,4]",
        )
        return found


TUNE_PROFILE = ProfileRangesConfig(
    max_num_tokens=256, max_batch_size=32, max_prefill_chunk=256, max_kv_cache_size=256
)
"""The smallest ranges a tune's bundle is profiled over (the pipeline's and the capacity stage's
defaults on CPU); widened to what the workload and the space's largest knobs need."""
CAPACITY_ONLY: Mapping[str, Any] = MappingProxyType(
    {
        "step_band": 0.0,
        "sim_seeds": 1,
        "verify": "false",
        "verify_seed": "auto",
        "verify_probe_requests": 0,
        "phase": "all",
        "real_from": None,
    }
)
"""The capacity stage's own options, as a tune runs the capacity stage's steps: no band, no check
of its own (``tune.verify`` checks), every real search seeded at its configuration's simulated
capacity, one phase."""


@dataclass(frozen=True)
class TunePredictorConfig:
    """The predictor's setting a tune may change (``vidur.predictor.*``); the rest Vidur's
    defaults (:class:`~gpu_simulate_test.config.vidur.VidurPredictorConfig`)."""

    num_training_job_threads: int = 2

    def __post_init__(self) -> None:
        _check(
            self.num_training_job_threads >= 1,
            "vidur.predictor.num_training_job_threads must be >= 1",
        )


@dataclass(frozen=True)
class TuneSimulatorConfig:
    """The simulator settings a tune reads (``vidur.*``). Its scheduler is each configuration's
    own: vLLM's V1 scheduler, its batch caps, block size, KV blocks, chunked prefill and prefix
    caching derived from the configuration's knobs (``tune.space`` over ``backend.*``); its
    engine overhead the calibration's (``engine_overhead``); each step's time scale the tune's
    to set. Everything else is :class:`~gpu_simulate_test.config.vidur.VidurConfig`'s
    default."""

    predictor: TunePredictorConfig = field(default_factory=TunePredictorConfig)
    step_jitter: bool = False
    """Every simulated step times a factor drawn from the calibrated decode steps' spread."""
    busy_spread: bool = False
    """``vidur.busy_spread``: a busy step's fast spread from its band's calibrated steps."""
    seed: int = 42

    def vidur(self) -> VidurConfig:
        """The simulator's whole config: these settings, the rest Vidur's defaults."""
        predictor = VidurPredictorConfig(
            num_training_job_threads=self.predictor.num_training_job_threads
        )
        return VidurConfig(
            predictor=predictor,
            step_jitter=self.step_jitter,
            busy_spread=self.busy_spread,
            seed=self.seed,
        )


@dataclass(frozen=True)
class TuneStageConfig(SearchStageBase):
    """``tune``: the engine, the workload's shape and the bundle
    (:class:`~gpu_simulate_test.config.search.SearchStageBase`), the simulator settings a tune
    reads (``vidur.*``), the goals, the rates and the real search's sizing (``capacity.*``), and
    the space (``tune.*``)."""

    vidur: TuneSimulatorConfig = field(default_factory=TuneSimulatorConfig)
    capacity: SearchOptions = field(default_factory=SearchOptions)
    tune: TuneOptions = field(default_factory=TuneOptions)

    def __post_init__(self) -> None:
        _check(
            self.backend.name in ("vllm", "vllm_engine"),
            f"backend={self.backend.name}: the tune searches vLLM's knobs; use backend=vllm "
            "(a vLLM server) or backend=vllm_engine",
        )

    def pipeline_fields(self) -> dict[str, Any]:
        """The simulator's whole config and the tune's profile ranges (the profile's and the
        real bench's other settings: the pipeline's defaults)."""
        return {"vidur": self.vidur.vidur(), "profile": TUNE_PROFILE}

    def as_capacity(self, **options: Any) -> CapacityStageConfig:
        """The capacity stage's config whose steps the tune runs (the bundle, a real search):
        its fields, ``capacity.*`` as the tune's and :data:`CAPACITY_ONLY` (``options``
        replace any of them)."""
        inner = self.pipeline()
        shared = {
            name: getattr(inner, name)
            for name in CapacityStageConfig.__dataclass_fields__
            if name in PipelineStageConfig.__dataclass_fields__
        }
        capacity = CapacityOptions(**{**self.capacity.search_fields(), **CAPACITY_ONLY, **options})
        return CapacityStageConfig(**shared, capacity=capacity)
