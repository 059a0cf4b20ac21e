"""Typed config of the ``capacity`` stage: the highest rate (requests/s; sessions/s for a
multi-turn workload) that meets latency goals."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

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
VERIFY_SEEDS: tuple[str, ...] = ("auto", "probe")


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
    verify_seed: str = "auto"
    """Where the real search starts: ``auto``, the simulated answer when there is one (``phase=
    all`` runs the simulated search first), else the capacity a burst probe measures; ``probe``:
    the probe, always."""
    verify_probe_requests: int = 0
    """Requests (sessions) in the probe's burst; 0: 16 for hf_generate, else max(64, 3 × the
    batch cap), as ``fidelity.probe_requests``."""
    verify_step: float = 2.0
    """From the seed the rate is divided (the seed missed the goals) or multiplied (it met them)
    by this factor until one rate meets them and another misses: the bracket."""
    verify_bracket: float = 0.1
    """Then bisection (geometric) until the bracket's high / low ≤ 1 + this, and stop."""
    verify_budget_s: float = 0.0
    """Wall seconds the real search (probe included) may take: a rate that would not fit in what
    is left is not run, and the record and the console say so; 0: no budget."""
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
        self._check_real_search()
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

    def _check_real_search(self) -> None:
        """The real search's knobs (``verify=search``): each in range, the count's floor under
        its cap."""
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
            self.verify_seed in VERIFY_SEEDS,
            f"capacity.verify_seed={self.verify_seed!r} must be one of {', '.join(VERIFY_SEEDS)}",
        )
        _check(self.verify_probe_requests >= 0, "capacity.verify_probe_requests must be >= 0")
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
class CapacityStageConfig(PipelineStageConfig):
    """``capacity``: the pipeline's fields (model, hardware, the engine's knobs, the workload's
    shape; its ``qps`` is the search's to set) and the search's (``capacity.*``)."""

    capacity: CapacityOptions = field(default_factory=CapacityOptions)
