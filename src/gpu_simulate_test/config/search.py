"""What the ``capacity`` and ``tune`` stages share: the search's settings both read (the goals,
the grid, how many requests judge a rate, the real search's steps and budget), and the stage
fields both hand to the pipeline's steps (:class:`SearchStageBase`: the engine, the workload's
shape, the bundle), from which each builds the pipeline config of its runs with the pipeline's
defaults for what it does not hold (:meth:`SearchStageBase.pipeline`)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from gpu_simulate_test.config.backends import BackendConfig, VllmBackendConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import (
    GoodputConfig,
    HardwareConfig,
    ModelConfig,
    OutputConfig,
    WorkloadConfig,
    _check,
)
from gpu_simulate_test.io.layout import PROFILING_ROOT

SLO_PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
"""The percentiles a goal may name: the latency percentiles every table shows
(``core.percentiles.LATENCY_PERCENTILES``; config imports nothing above it, a test holds the two
equal)."""


@dataclass(frozen=True)
class SloConfig:
    """Latency goals at one percentile; 0 leaves a metric without a goal (at least one is set)."""

    percentile: int = 90
    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    e2e_ms: float = 0.0

    def __post_init__(self) -> None:
        _check(
            self.percentile in SLO_PERCENTILES,
            f"capacity.slo.percentile={self.percentile} is not one of "
            + ", ".join(map(str, SLO_PERCENTILES)),
        )
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            value = getattr(self, name)
            _check(
                math.isfinite(value) and value >= 0,
                f"capacity.slo.{name}={value} must be >= 0 (0: no goal)",
            )
        _check(
            any(getattr(self, n) > 0 for n in ("ttft_ms", "tpot_ms", "e2e_ms")),
            "capacity.slo: set at least one of ttft_ms, tpot_ms, e2e_ms",
        )

    def goodput_goals(self) -> GoodputConfig:
        """The same goals per request, for goodput (``vllm bench serve --goodput``)."""
        return GoodputConfig(
            ttft=self.ttft_ms or None, tpot=self.tpot_ms or None, e2el=self.e2e_ms or None
        )

    def goals(self) -> dict[str, float]:
        """metric → goal (ms), for the metrics that have one."""
        return {
            metric: value
            for metric, value in (
                ("ttft", self.ttft_ms),
                ("tpot", self.tpot_ms),
                ("e2e", self.e2e_ms),
            )
            if value > 0
        }


@dataclass(frozen=True)
class SearchOptions:
    """How a search judges a rate and brackets the answer (``capacity.*``): what the capacity
    stage and the tune both read; :class:`~gpu_simulate_test.config.capacity.CapacityOptions`
    adds the capacity stage's own (its band, its check, its split)."""

    slo: SloConfig = field(default_factory=lambda: SloConfig(ttft_ms=100.0, tpot_ms=30.0))
    qps_min: float = 1.0
    """The lowest rate of the grid (requests/s; a multi-turn workload's sessions/s, each
    session's turn 0)."""
    qps_max: float = 64.0
    """The highest rate of the grid."""
    points: int = 8
    """Rates on the grid, spaced geometrically from ``qps_min`` to ``qps_max`` (the curve)."""
    refine: int = 4
    """Bisection steps between the last rate that met the goals and the first that did not."""
    extend: int = 2
    """Rates the grid goes on past ``qps_min`` (even it missed the goals) or past ``qps_max``
    (it still met them), at the grid's own spacing, so that the answer is a rate, not "below
    the grid"; 0: never."""
    verify_seconds: float = 30.0
    """``verify=search``: each rate replays the requests arriving in this many seconds at that
    rate, ⌈rate × seconds⌉ of them (the workload's first ones, arrivals scaled; a multi-turn
    workload's first sessions), within ``verify_min_requests`` .. ``verify_requests``."""
    verify_min_requests: int = 32
    """At least this many requests (sessions) per rate, so that a p90 or p99 means something."""
    verify_requests: int = 0
    """At most this many requests (sessions) per rate; 0: no cap (``verify_seconds`` decides)."""
    sim_window: bool = False
    """Judge each simulated rate on the requests the real search replays at that rate (the
    workload's first :meth:`requests_at`, arrivals scaled) instead of the whole workload: the
    simulation and the real engine then answer on the same requests, as a check compares them.
    Near a goal, a p90 over the first 100 requests and one over 400 differ by tens of percent
    (Poisson arrivals bunch differently), one-signed for a given seed. A workload without
    enough requests for a rate's window is simulated whole; multi-turn workloads always are."""
    verify_step: float = 2.0
    """From the seed the rate is divided (the seed missed the goals) or multiplied (it met them)
    by this factor until one rate meets them and another misses: the bracket. A factor under 2
    squares after each step that did not bracket, up to 2 (``tune.verify``'s 15% steps reach
    21x from the seed in six, not 2.3x)."""
    verify_bracket: float = 0.1
    """Then bisection (geometric) until the bracket's high / low ≤ 1 + this, and stop."""
    verify_budget_s: float = 0.0
    """Wall seconds the real search (probe included) may take: a rate that would not fit in what
    is left is not run, and the record and the console say so; 0: no budget."""

    def __post_init__(self) -> None:
        _check(
            math.isfinite(self.qps_min) and self.qps_min > 0,
            f"capacity.qps_min={self.qps_min} must be a positive rate",
        )
        _check(
            math.isfinite(self.qps_max) and self.qps_max > self.qps_min,
            f"capacity.qps_max={self.qps_max} must be above capacity.qps_min={self.qps_min}",
        )
        _check(self.points >= 2, "capacity.points must be >= 2")
        _check(self.refine >= 0, "capacity.refine must be >= 0")
        _check(self.extend >= 0, "capacity.extend must be >= 0")
        _check(
            math.isfinite(self.verify_seconds) and self.verify_seconds > 0,
            f"capacity.verify_seconds={self.verify_seconds} must be > 0 (seconds of arrivals per "
            "rate)",
        )
        _check(self.verify_min_requests >= 8, "capacity.verify_min_requests must be >= 8")
        _check(
            self.verify_requests == 0 or self.verify_requests >= self.verify_min_requests,
            f"capacity.verify_requests={self.verify_requests} caps each rate below "
            f"capacity.verify_min_requests={self.verify_min_requests}: set it to 0 (no cap, "
            "capacity.verify_seconds decides) or at least the minimum",
        )
        _check(
            math.isfinite(self.verify_step) and self.verify_step > 1,
            f"capacity.verify_step={self.verify_step} must be a factor > 1",
        )
        _check(
            math.isfinite(self.verify_bracket) and self.verify_bracket > 0,
            f"capacity.verify_bracket={self.verify_bracket} must be > 0 (bisect until high / "
            "low <= 1 + it)",
        )
        _check(
            math.isfinite(self.verify_budget_s) and self.verify_budget_s >= 0,
            f"capacity.verify_budget_s={self.verify_budget_s} must be >= 0 (0: no budget)",
        )

    def search_fields(self) -> dict[str, Any]:
        """These fields by name (the goals as their :class:`SloConfig`), to build a
        :class:`~gpu_simulate_test.config.capacity.CapacityOptions` from."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(SearchOptions)}

    def window_record(self) -> dict[str, Any] | None:
        """``sim_window``'s record in ``capacity.json`` / ``tune.json``: the requests each
        simulated rate judged (None: the whole workload at every rate)."""
        if not self.sim_window:
            return None
        return {
            "seconds": self.verify_seconds,
            "min_requests": self.verify_min_requests,
            "max_requests": self.verify_requests or None,
        }

    def requests_at(self, qps: float) -> int:
        """Requests (sessions) the real search replays at ``qps``: ⌈qps × verify_seconds⌉,
        within ``verify_min_requests`` .. ``verify_requests`` (0: no cap)."""
        count = max(self.verify_min_requests, math.ceil(qps * self.verify_seconds - 1e-9))
        return min(count, self.verify_requests) if self.verify_requests else count


@dataclass(frozen=True)
class SearchStageBase:
    """The fields the capacity stage and the tune hand to the pipeline's steps (the workload,
    the bundle, the real bench, the simulation) and read themselves: the model and device, the
    workload's shape (its ``qps`` is the search's to set), the engine's knobs, where the bundle
    lives and when it is made again, and where the runs land. Each stage adds its own; none
    holds the pipeline's comparison, its repeat or its goodput goals (a search judges by
    ``capacity.slo``)."""

    model: ModelConfig = MISSING
    hardware: HardwareConfig = MISSING
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    backend: BackendConfig = field(default_factory=VllmBackendConfig)
    """The engine (``backend=<name>``) and its knobs, as the pipeline's ``backend``."""
    profiling_root: str = PROFILING_ROOT
    """Bundles live in ``<profiling_root>/<hardware.name>/<model.name>/``."""
    reuse_profile: bool = True
    """Reuse the bundle there when it fits (the pipeline's ``reuse_profile``)."""
    accept_profile_warnings: bool = False
    """Simulate with a bundle whose profile still looks disturbed (the pipeline's)."""
    validate_calibration: bool = True
    """After a fresh profile, replay a short validation workload (the pipeline's)."""
    engine_overhead: bool = True
    """Calibrate the serving engine's per-step cost while profiling and simulate with it (the
    pipeline's); false simulates Vidur's per-op model alone."""
    output: OutputConfig = field(default_factory=OutputConfig)
    progress: bool = True

    def pipeline_fields(self) -> dict[str, Any]:
        """The pipeline fields the stage holds in another shape, or in code: none here."""
        return {}

    def pipeline(self) -> PipelineStageConfig:
        """The pipeline config of the stage's runs: the fields it shares with the pipeline,
        :meth:`pipeline_fields`, and the pipeline's defaults for the rest (no comparison, no
        repeat, no goodput goals)."""
        own = self.__dataclass_fields__
        given = {
            name: getattr(self, name)
            for name in PipelineStageConfig.__dataclass_fields__
            if name in own
        }
        given.update(self.pipeline_fields())
        return PipelineStageConfig(**given)
