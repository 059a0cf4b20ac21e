"""Typed config of the ``capacity`` stage: the highest rate (requests/s; sessions/s for a
multi-turn workload) that meets latency goals."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from gpu_simulate_test.config.backends import CLIENT_ROUTERS, BackendConfig
from gpu_simulate_test.config.fleet import FleetConfig
from gpu_simulate_test.config.real_bench import ATTN_IMPLEMENTATIONS
from gpu_simulate_test.config.schema import DTYPES, ProfilingConfig, _check, _check_choice
from gpu_simulate_test.config.search import (
    SLO_PERCENTILES,
    SearchOptions,
    SearchStageBase,
    SloConfig,
)
from gpu_simulate_test.config.vidur import (
    ProfileRangesConfig,
    VidurConfig,
    check_scheduler_named_once,
)

__all__ = (
    "CAPACITY_PHASES",
    "SLO_PERCENTILES",
    "VERIFY_MODES",
    "VERIFY_SEEDS",
    "CapacityOptions",
    "CapacityStageConfig",
    "SloConfig",
)

VERIFY_MODES: tuple[str, ...] = ("false", "answer", "search")
CAPACITY_PHASES: tuple[str, ...] = ("all", "real", "sim")
VERIFY_SEEDS: tuple[str, ...] = ("auto", "probe")


@dataclass(frozen=True)
class CapacityOptions(SearchOptions):
    """How the search runs: the goals, grid and real search's sizing every search reads
    (:class:`~gpu_simulate_test.config.search.SearchOptions`), and the capacity stage's own:
    its band, its check on the real engine and its split in two phases."""

    step_band: float = 0.1
    """The search again with every simulated step this fraction longer, and again this fraction
    shorter (``vidur.step_time_scale``): how far a step-time error of that size moves the
    answer (``capacity.json`` ``step_band``, a shaded band on the plot); 0: not run."""
    sim_seeds: int = 3
    """The simulated search under this many noise seeds (``vidur.seed``, +1, ...); the median
    seed's search answers, every seed's answer beside it (``capacity.json`` ``sim_seeds``,
    :mod:`gpu_simulate_test.capacity.seeds`): near the knee one seed moves an answer by several
    percent. 1: one search."""
    verify: str = "false"
    """``answer`` (or ``true``): replay the workload at the answer on the real engine
    (backend.*) and check the goals; ``search``: run the same search on the real engine and set
    its measured capacity beside the answer; ``false``: neither."""
    verify_seed: str = "auto"
    """Where the real search starts: ``auto``, the simulated answer when there is one (``phase=
    all`` runs the simulated search first), else the capacity a burst probe measures; ``probe``:
    the probe, always."""
    verify_probe_requests: int = 0
    """Requests (sessions) in the probe's burst; 0: 16 for hf_generate, else max(64, 3 × the
    batch cap), as ``fidelity.probe_requests``."""
    phase: str = "all"
    """``all``: the search here (and ``verify``'s check); ``real``: the bundle and the real
    search only, never importing Vidur (the GPU machine's half: its run directory, with its bundle,
    can be tarred and moved); ``sim``: the simulated search from a ``real`` run's directory
    (``real_from``), set beside the real search it recorded. ``real`` and ``sim`` imply
    ``verify=search``."""
    real_from: str | None = None
    """``phase=sim``: the run directory of a ``capacity.phase=real`` run."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check(
            math.isfinite(self.step_band) and 0 <= self.step_band < 1,
            f"capacity.step_band={self.step_band} must be a fraction in [0, 1) (0: no band)",
        )
        _check(
            isinstance(self.sim_seeds, int) and not isinstance(self.sim_seeds, bool)
            and self.sim_seeds >= 1,
            f"capacity.sim_seeds={self.sim_seeds} must be a whole number >= 1 (noise seeds)",
        )  # fmt: skip
        # capacity.verify=true from the command line arrives as "True"
        mode = {"true": "answer", "false": "false"}.get(str(self.verify).lower(), self.verify)
        _check(
            mode in VERIFY_MODES,
            f"capacity.verify={self.verify!r} must be one of false, answer (true), search",
        )
        object.__setattr__(self, "verify", mode)
        _check(
            self.verify_seed in VERIFY_SEEDS,
            f"capacity.verify_seed={self.verify_seed!r} must be one of {', '.join(VERIFY_SEEDS)}",
        )
        _check(self.verify_probe_requests >= 0, "capacity.verify_probe_requests must be >= 0")
        _check(
            self.phase in CAPACITY_PHASES,
            f"capacity.phase={self.phase!r} must be one of {', '.join(CAPACITY_PHASES)}",
        )
        if self.phase != "all":  # the split is the real search's: answer needs the answer first
            _check(
                mode != "answer",
                f"capacity.phase={self.phase} runs the real search (capacity.verify=search); "
                "capacity.verify=answer needs the simulated answer before the real run",
            )
            object.__setattr__(self, "verify", "search")
        _check(
            (self.phase == "sim") == bool(self.real_from),
            "capacity.phase=sim needs capacity.real_from=<the run directory of a "
            "capacity.phase=real run>, and capacity.real_from goes with phase=sim only "
            f"(phase={self.phase}, real_from={self.real_from})",
        )


@dataclass(frozen=True)
class CapacityStageConfig(SearchStageBase):
    """``capacity``: the engine, the workload's shape (its ``qps`` is the search's to set) and
    the bundle (:class:`~gpu_simulate_test.config.search.SearchStageBase`); the simulator's
    settings (``vidur.*``: any backend, ``openai``'s scheduler as given), the profile's and
    the real bench's the pipeline has; and the search's (``capacity.*``). The pipeline's
    comparison, repeat and goodput goals are not here: a search judges by ``capacity.slo``."""

    vidur: VidurConfig = field(default_factory=VidurConfig)
    profile: ProfileRangesConfig = field(default_factory=ProfileRangesConfig)
    """Smallest ranges to profile; widened to what the workload and scheduler need."""
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    dtype: str = "auto"
    """Real bench dtype: float32, bfloat16, float16, or auto (bf16 on CUDA, fp32 on CPU)."""
    attn_implementation: str = "sdpa"
    num_warmup_requests: int = 2
    capacity: CapacityOptions = field(default_factory=CapacityOptions)
    fleet: FleetConfig = field(default_factory=FleetConfig)
    """``fleet.replicas=N fleet.router=R``: the capacity of N engines behind router R (one GPU
    each). Behind ``vllm_dp`` the real check serves them as one ``--data-parallel-size N``
    server (``backend.data_parallel_size`` is N); behind another router as N servers behind the
    client's own router (``backend.servers`` is N, :func:`fleet_backend`). Without a real check
    the backend stays one engine (its calibration is one engine's, as a tune's fleets). One
    replica (the default): ``backend.data_parallel_size``'s fleet."""

    def __post_init__(self) -> None:
        check_scheduler_named_once(self.backend, self.vidur.scheduler)
        _check(
            self.dtype == "auto" or self.dtype in DTYPES,
            f"dtype={self.dtype!r} is not one of auto, {', '.join(DTYPES)}",
        )
        _check_choice("attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
        _check(self.num_warmup_requests >= 0, "num_warmup_requests must be >= 0")
        ranks = int(getattr(self.backend, "data_parallel_size", 1))
        if self.fleet.replicas == 1 and ranks > 1 and not real_check(self):
            # the old spelling of a vllm_dp fleet, simulated only: as fleet.replicas=N
            fleet = dataclasses.replace(self.fleet, replicas=ranks, router="vllm_dp")
            object.__setattr__(self, "fleet", fleet)
        object.__setattr__(self, "backend", fleet_backend(self))

    def fleet_of(self) -> FleetConfig:
        """The fleet searched: ``fleet.*``, or ``backend.data_parallel_size`` engines behind
        vLLM's balancer when ``fleet.replicas`` is 1."""
        if self.fleet.replicas > 1:
            return self.fleet
        return FleetConfig(replicas=int(getattr(self.backend, "data_parallel_size", 1)))


def real_check(cfg: CapacityStageConfig) -> bool:
    """Whether the run measures the real engine (``capacity.verify`` or the real phase)."""
    return cfg.capacity.verify != "false" or cfg.capacity.phase == "real"


def fleet_backend(cfg: CapacityStageConfig) -> BackendConfig:
    """The backend that serves ``cfg.fleet`` on the real engine: ``--data-parallel-size N``
    behind ``vllm_dp``, N servers behind another router; the backend as given where no real
    check is asked for (the simulation copies one engine). ConfigError where the fleet cannot
    be checked on a real engine and a check is asked for, or where ``fleet.*`` and
    ``backend.data_parallel_size`` name two fleets."""
    fleet, backend = cfg.fleet, cfg.backend
    ranks = int(getattr(backend, "data_parallel_size", 1))
    if fleet.replicas == 1:
        return backend
    _check(
        ranks in (1, fleet.replicas) and (ranks == 1 or fleet.router == "vllm_dp"),
        f"fleet.replicas={fleet.replicas} fleet.router={fleet.router} and "
        f"backend.data_parallel_size={ranks} name two fleets: set one of them",
    )
    served = fleet.router == "vllm_dp" and hasattr(backend, "data_parallel_size")
    routed = fleet.router in CLIENT_ROUTERS and hasattr(backend, "servers")
    checked = real_check(cfg)
    _check(
        served or routed or not checked,
        f"fleet.replicas={fleet.replicas} behind fleet.router={fleet.router} on "
        f"backend={backend.name}: the capacity's real check serves a fleet as vLLM's "
        "--data-parallel-size server (fleet.router=vllm_dp) or as N vLLM servers behind the "
        "client's router (backend=vllm); simulate it alone with capacity.verify=false",
    )
    if routed and checked:  # N servers behind the client's router, each check a fresh fleet
        return dataclasses.replace(  # type: ignore[call-arg]
            backend, servers=fleet.replicas, router=fleet.router, router_poll_s=fleet.poll_s
        )
    if served and checked:  # one --data-parallel-size N server
        return dataclasses.replace(backend, data_parallel_size=fleet.replicas)  # type: ignore[call-arg]
    if ranks > 1:  # simulated only: one engine's calibration, copied N times (as tune's)
        return dataclasses.replace(backend, data_parallel_size=1)  # type: ignore[call-arg]
    return backend
