"""Typed config of the ``fidelity`` stage: capacity, loads real and simulated, one error table."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import _check, _check_choice

FIDELITY_PHASES: tuple[str, ...] = ("all", "real", "sim")


@dataclass(frozen=True)
class FidelityOptions:
    """How the campaign runs; every other field of the stage is the pipeline's."""

    loads: tuple[float, ...] = (0.2, 0.5, 0.85)
    """Load levels as fractions of the measured capacity, each in (0, 1]."""
    num_requests: int = 64
    """Requests per load at least (one seed: every load replays the same lengths); a load gets
    more when ``load_duration_s`` of arrivals at its rate need more."""
    load_duration_s: float = 30.0
    """Seconds of arrivals per load at least: a load of ``max(num_requests, ceil(qps ×
    load_duration_s))`` requests, long enough for the queue to reach a steady state (0: exactly
    ``num_requests``)."""
    warmup_s: float = 5.0
    """Requests arriving in a load's first seconds warm the queue up and are simulated, but left
    out of every statistic (real, simulated and the noise floor); the report says how many."""
    probe_requests: int = 0
    """Requests in the all-at-once capacity burst; 0 picks by backend: 16 for hf_generate
    (one request at a time), else max(64, 3 × the batch cap), so the engine runs at its cap
    for most of the burst."""
    capacity_qps: float = 0.0
    """A known capacity (requests/s; sessions/s for a multi-turn workload): no probe is run.
    0 measures it."""
    real_repeats: int = 1
    """Real bench runs per load on the same workload; from 2 on, the report carries the real
    side's run-to-run difference (the noise floor) next to the simulator's error."""
    reruns: int = 2
    """Re-runs a disturbed real run may get per load (late sends, held-back streams, foreign
    CPU: :mod:`gpu_simulate_test.core.host.disturbance`), each after waiting for the
    machine to go quiet; 0 marks it only. The report says which runs were disturbed and what was
    done."""
    calibrate_each_load: bool = False
    """Profile and calibrate right before every load's real run, into the load's own bundle,
    instead of once per campaign (on a host whose speed drifts over minutes). The default
    campaign (``configs/fidelity.yaml``) sets it: calibrated once, its 85% runs' steps ran at
    0.81-0.87 of the calibration's in three campaigns (docs/fidelity.md)."""
    torch_threads: int = 0
    """torch's intra-op threads for every stage of the run (0: torch's default)."""
    phase: str = "all"
    """all: one call. real: the GPU half (probe, profile, real runs; never imports Vidur) and
    its manifest. sim: simulate and report the real phase in ``real_from``."""
    real_from: str | None = None
    """phase=sim: the run directory of a ``phase=real`` run (``tmp/fidelity/<run_id>``), or of a
    bench_import (``tmp/bench_import/<run_id>``: each imported run a load)."""
    summarize: tuple[str, ...] = ()
    """Instead of a campaign: one table over these fidelity runs or reports (run directories,
    ``fidelity.json`` or older ``<name>-fidelity.json`` files), written as ``summary.md``."""

    def __post_init__(self) -> None:
        _check(len(self.loads) > 0, "fidelity.loads must list at least one load fraction")
        for fraction in self.loads:
            _check(
                0 < fraction <= 1,
                f"fidelity.loads: {fraction} is not a fraction of capacity in (0, 1]",
            )
        _check(
            list(self.loads) == sorted(set(self.loads)),
            f"fidelity.loads={list(self.loads)} must be increasing, without repeats",
        )
        _check(self.num_requests >= 2, "fidelity.num_requests must be >= 2")
        _check(
            math.isfinite(self.load_duration_s) and self.load_duration_s >= 0,
            "fidelity.load_duration_s must be >= 0 seconds (0: fidelity.num_requests per load)",
        )
        _check(
            math.isfinite(self.warmup_s) and self.warmup_s >= 0,
            "fidelity.warmup_s must be >= 0 seconds",
        )
        if self.load_duration_s:
            _check(
                self.warmup_s < self.load_duration_s,
                f"fidelity.warmup_s={self.warmup_s} must be shorter than "
                f"fidelity.load_duration_s={self.load_duration_s}: nothing would be measured",
            )
        _check(self.probe_requests >= 0, "fidelity.probe_requests must be >= 0 (0: by backend)")
        _check(
            math.isfinite(self.capacity_qps) and self.capacity_qps >= 0,
            "fidelity.capacity_qps must be >= 0 (0: measure it)",
        )
        _check(self.real_repeats >= 1, "fidelity.real_repeats must be >= 1")
        _check(self.reruns >= 0, "fidelity.reruns must be >= 0 (0: mark disturbed runs only)")
        _check(self.torch_threads >= 0, "fidelity.torch_threads must be >= 0 (0: torch's own)")
        _check_choice("fidelity.phase", self.phase, FIDELITY_PHASES)
        if self.phase == "sim":
            _check(
                bool(self.real_from),
                "fidelity.phase=sim needs fidelity.real_from=<the run directory of a "
                "fidelity.phase=real run, or of a bench_import>",
            )
        else:
            _check(
                not self.real_from,
                f"fidelity.real_from goes with fidelity.phase=sim only (phase={self.phase})",
            )

    def requests_at(self, qps: float) -> int:
        """Requests of a load offered at ``qps``: ``num_requests``, or more for
        ``load_duration_s`` of arrivals."""
        return max(self.num_requests, math.ceil(qps * self.load_duration_s))


@dataclass(frozen=True)
class FidelityStageConfig(PipelineStageConfig):
    """``fidelity``: the pipeline's fields (model, hardware, backend, workload shape, engine
    knobs) and the campaign's (``fidelity.*``). The workload's ``num_requests`` and ``qps`` are
    set per load by the campaign."""

    fidelity: FidelityOptions = field(default_factory=FidelityOptions)
