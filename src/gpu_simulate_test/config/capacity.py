"""Typed config of the ``capacity`` stage: the highest rate (requests/s; sessions/s for a
multi-turn workload) that meets latency goals."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import GoodputConfig, _check

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


VERIFY_MODES: tuple[str, ...] = ("false", "answer", "search")
CAPACITY_PHASES: tuple[str, ...] = ("all", "real", "sim")


@dataclass(frozen=True)
class CapacityOptions:
    """How the search runs."""

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
    step_band: float = 0.1
    """The search again with every simulated step this fraction longer, and again this fraction
    shorter (``vidur.step_time_scale``): how far a step-time error of that size moves the
    answer (``capacity.json`` ``step_band``, a shaded band on the plot); 0: not run."""
    verify: str = "false"
    """``answer`` (or ``true``): replay the workload at the answer on the real engine
    (backend.*) and check the goals; ``search``: run the same search on the real engine and set
    its measured capacity beside the answer; ``false``: neither."""
    verify_requests: int = 128
    """Requests per rate of ``verify=search`` (the workload's first ones, arrivals scaled; a
    multi-turn workload's first sessions, as ``workload.num_requests`` counts them)."""
    verify_stop_after: int = 2
    """``verify=search``: the grid's higher rates are not run after this many misses in a row
    (an overloaded real engine queues for minutes and takes the client's CPU); 0: run them all."""
    phase: str = "all"
    """``all``: the search here (and ``verify``'s check); ``real``: the bundle and the real
    search only, never importing Vidur (the GPU machine's half: its run directory, with its bundle,
    can be tarred and moved); ``sim``: the simulated search from a ``real`` run's directory
    (``real_from``), set beside the real search it recorded. ``real`` and ``sim`` imply
    ``verify=search``."""
    real_from: str | None = None
    """``phase=sim``: the run directory of a ``capacity.phase=real`` run."""

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
        _check(self.verify_stop_after >= 0, "capacity.verify_stop_after must be >= 0")
        _check(
            math.isfinite(self.step_band) and 0 <= self.step_band < 1,
            f"capacity.step_band={self.step_band} must be a fraction in [0, 1) (0: no band)",
        )
        # capacity.verify=true from the command line arrives as "True"
        mode = {"true": "answer", "false": "false"}.get(str(self.verify).lower(), self.verify)
        _check(
            mode in VERIFY_MODES,
            f"capacity.verify={self.verify!r} must be one of false, answer (true), search",
        )
        object.__setattr__(self, "verify", mode)
        _check(self.verify_requests >= 8, "capacity.verify_requests must be >= 8")
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
class CapacityStageConfig(PipelineStageConfig):
    """``capacity``: the pipeline's fields (model, hardware, the engine's knobs, the workload's
    shape; its ``qps`` is the search's to set) and the search's (``capacity.*``)."""

    capacity: CapacityOptions = field(default_factory=CapacityOptions)
