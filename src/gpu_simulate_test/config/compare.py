"""Typed config of the ``compare`` stage: a real run against a simulated run, or a sweep report."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from gpu_simulate_test.config.schema import (
    ConfigError,
    GoodputConfig,
    OutputConfig,
    _check_choice,
)

SWEEP_AXES: tuple[str, ...] = ("offered_qps", "batch_size_cap", "run")


@dataclass(frozen=True)
class CompareOptions:
    """How a comparison is reported."""

    plots: bool = True
    """Draw the PNG plots (CDFs, scatter, error by length) and embed them in summary.md."""
    sweep_x: str = "offered_qps"
    """Sweep report x axis: offered_qps (from the arrivals), batch_size_cap or run (order given)."""

    warmup_s: float = 0.0
    """Leave out of every statistic the requests that arrive in the run's first ``warmup_s``
    seconds (from the first scheduled arrival): they fill the queue on both sides, then the
    comparison starts. ``comparison.json`` counts them (``num_warmup_excluded``)."""

    def __post_init__(self) -> None:
        _check_choice("compare.sweep_x", self.sweep_x, SWEEP_AXES)
        if not (math.isfinite(self.warmup_s) and self.warmup_s >= 0):
            raise ConfigError(f"compare.warmup_s={self.warmup_s} must be >= 0 seconds")


@dataclass(frozen=True)
class CompareStageConfig:
    """``compare``: join a real_bench run and a vidur_simulate run of one workload per request.

    With ``sweep_dirs`` instead, report several compare runs (one per load level) together.
    """

    real_run_dir: str | None = None
    """A complete real_bench run (``tmp/real_bench/<run_id>``)."""
    sim_run_dir: str | None = None
    """A complete vidur_simulate run of the same workload (``tmp/vidur_simulate/<run_id>``)."""
    real_repeat_dir: str | None = None
    """A second real_bench run of the same workload (the pipeline's ``<run_id>-r2``): the
    truth's run-to-run difference, beside the simulator's error on each clock."""
    sim_seed_dirs: tuple[str, ...] = ()
    """More vidur_simulate runs of the same workload and bundle with other seeds (the
    pipeline's ``<run_id>-seed<k>``): the range of the simulator's error over its own draws,
    beside the truth's run-to-run difference on each clock (reported, not judged)."""
    at_level_dir: str | None = None
    """The same workload simulated at the real run's own step level (the pipeline's
    ``<run_id>-at-level``, ``vidur.step_time_scale``): the model's error apart from the host's
    speed, beside the answer on each clock (a diagnosis, not judged; docs/compare.md)."""
    replaced_runs: tuple[str, ...] = ()
    """Real runs of this workload a re-run replaced because the host disturbed them (the
    pipeline's ``<run_id>-rerun<k>`` attempts; kept as evidence): the verdict names them."""
    sweep_dirs: tuple[str, ...] = ()
    """Compare runs to report as a sweep (glob patterns allowed, e.g. ``tmp/compare/q-*``)."""
    compare: CompareOptions = field(default_factory=CompareOptions)
    goodput: GoodputConfig = field(default_factory=GoodputConfig)
    """Goals per request (ms) for ``request_goodput``, as ``vllm bench serve --goodput``:
    ``goodput.ttft=500 goodput.tpot=50 goodput.e2el=1000`` (any subset; none: not reported)."""
    output: OutputConfig = field(default_factory=OutputConfig)
    progress: bool = True
    """Print the headline table."""

    def __post_init__(self) -> None:
        if self.sweep_dirs:
            one = (self.real_run_dir, self.sim_run_dir, self.real_repeat_dir, self.at_level_dir)
            if any(one) or self.sim_seed_dirs:
                raise ConfigError(
                    "pass either sweep_dirs=[...] (a sweep report) or real_run_dir= and "
                    "sim_run_dir= (one comparison, real_repeat_dir=, sim_seed_dirs= and "
                    "at_level_dir= optional), not both"
                )
            return
        if not (self.real_run_dir and self.sim_run_dir):
            raise ConfigError(
                "real_run_dir and sim_run_dir are required: pass "
                "real_run_dir=tmp/real_bench/<run_id> sim_run_dir=tmp/vidur_simulate/<run_id> "
                "(or sweep_dirs=[tmp/compare/<run_id>,...] for a sweep report)"
            )
