"""Typed config of the ``pipeline``: workload → profile → simulate → real bench → compare."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from gpu_simulate_test.config.backends import BackendConfig, VllmBackendConfig
from gpu_simulate_test.config.compare import CompareOptions
from gpu_simulate_test.config.real_bench import ATTN_IMPLEMENTATIONS
from gpu_simulate_test.config.schema import (
    DTYPES,
    GoodputConfig,
    HardwareConfig,
    ModelConfig,
    OutputConfig,
    ProfilingConfig,
    WorkloadConfig,
    _check,
    _check_choice,
)
from gpu_simulate_test.config.vidur import (
    ProfileRangesConfig,
    VidurConfig,
    check_scheduler_named_once,
)
from gpu_simulate_test.io.layout import PROFILING_ROOT


@dataclass(frozen=True)
class PipelineStageConfig:
    """One command, one set of overrides: every stage's config is built from these fields.

    Vidur's scheduler knobs are derived from ``backend`` (hf_cb ↔ sarathi, hf_generate ↔
    batch cap 1; see :mod:`gpu_simulate_test.core.engines.knobs`); ``vidur.scheduler`` is used as
    given only for the ``openai`` backend.
    """

    model: ModelConfig = MISSING
    hardware: HardwareConfig = MISSING
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    backend: BackendConfig = field(default_factory=VllmBackendConfig)
    """The engine of the truth (``backend=<name>``) and its knobs; a vLLM server by default."""
    vidur: VidurConfig = field(default_factory=VidurConfig)
    profile: ProfileRangesConfig = field(default_factory=ProfileRangesConfig)
    """Smallest ranges to profile; widened to what the workload and scheduler need."""
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    profiling_root: str = PROFILING_ROOT
    """Bundles live in ``<profiling_root>/<hardware.name>/<model.name>/``."""
    reuse_profile: bool = True
    """Reuse the bundle there when model dims, hardware, dtype, block size and ranges fit;
    otherwise (or when false) profile again and replace it."""
    accept_profile_warnings: bool = False
    """Simulate with a bundle whose profile still looks disturbed after re-timing (meta.json
    ``quality_warnings``); by default such a bundle is re-profiled rather than reused, and the
    pipeline stops if a fresh profile still carries them."""
    validate_calibration: bool = True
    """After a fresh profile, replay a short validation workload (the served shape, its own
    seed), simulate it with the new bundle and compare (``meta.json`` ``validation``); a miss
    over the limit redoes the calibration once, a second miss is a quality warning
    (:mod:`gpu_simulate_test.orchestrate.validation`). Synthetic workloads only."""
    real_repeat: bool = True
    """Run the real bench a second time on the same workload
    (``pipeline/<run_id>/runs/real_bench/<run_id>-r2``) and show the truth's run-to-run
    difference beside the simulator's error on each clock (the noise floor: an error within it
    is within the truth's own spread). The pipeline's own; the fidelity stage repeats its loads
    with ``fidelity.real_repeats``."""
    sim_seeds: int = 2
    """Simulate the same real arrivals again with this many other seeds (``vidur.seed`` + 1,
    + 2, …; ``pipeline/<run_id>/runs/vidur_simulate/<run_id>-seed<k>``) and show the range of
    the simulator's error over all its seeds beside the truth's run-to-run difference: the
    simulation's own draws (the step spread, the front end's, the wake-ups) moved the main
    job's client TTFT p90 by 4–16 points between four seeds of one run
    (benchmarks/results/tail_requests_20261205). Reported, not judged; 0: none. The
    pipeline's own; the tune searches under its own seeds (``tune.sim_seeds``)."""
    at_level: bool = True
    """Simulate the same real arrivals again at the real run's own step level (its busy steps
    over the step model's for the same steps, ``vidur.step_time_scale``;
    ``pipeline/<run_id>/runs/vidur_simulate/<run_id>-at-level``) and show that simulation's
    error beside the answer on each clock: the model's error apart from the host's speed
    (docs/compare.md, *At the real run's step level*). A diagnosis that reads the judged run,
    reported beside the verdict, never judged; a run without the engine's step record (hf_cb)
    or a fleet has none. The pipeline's own; the fidelity stage does the same per load."""
    real_reruns: int = 1
    """Re-runs the real run (and its repeat) may each get when the real bench marks it
    disturbed (late sends, held-back streams, foreign CPU): the disturbed run is kept as
    evidence (``pipeline/<run_id>/runs/real_bench/<id>-rerun<k>`` is the next), and
    ``summary.md``'s verdict says when a judged run stayed disturbed; 0 marks it only. The
    pipeline's own; the fidelity stage re-runs by ``fidelity.reruns``."""
    calibrate_beside_neighbours: bool = False
    """``backend.servers=N``: calibrate the engine beside its N - 1 neighbours
    (``engine.beside_neighbours``, docs/fleet.md)."""
    engine_overhead: bool = True
    """Calibrate the serving engine's per-step cost (LM head, sampling, the engine's Python)
    while profiling, and add it to the simulation (``vidur.engine_overhead=<backend.name>``);
    false simulates Vidur's per-op model alone."""
    dtype: str = "auto"
    """Real bench dtype: float32, bfloat16, float16, or auto (bf16 on CUDA, fp32 on CPU)."""
    attn_implementation: str = "sdpa"
    num_warmup_requests: int = 2
    compare: CompareOptions = field(default_factory=CompareOptions)
    goodput: GoodputConfig = field(default_factory=GoodputConfig)
    """Goals per request (ms) for ``request_goodput`` in the real bench, the simulation and the
    comparison, as ``vllm bench serve --goodput``: ``goodput.ttft=500 goodput.tpot=50
    goodput.e2el=1000`` (any subset; none: not reported)."""
    output: OutputConfig = field(default_factory=OutputConfig)
    """Every stage lands in ``<output.root>/<stage>/<output.run_id>/`` (one id for all)."""
    progress: bool = True

    def __post_init__(self) -> None:
        _check(
            self.dtype == "auto" or self.dtype in DTYPES,
            f"dtype={self.dtype!r} is not one of auto, {', '.join(DTYPES)}",
        )
        _check_choice("attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
        _check(self.num_warmup_requests >= 0, "num_warmup_requests must be >= 0")
        _check(self.sim_seeds >= 0, "sim_seeds must be >= 0 (0: the one simulation only)")
        _check(self.real_reruns >= 0, "real_reruns must be >= 0 (0: mark disturbed runs only)")
        check_scheduler_named_once(self.backend, self.vidur.scheduler)

    def pipeline(self) -> PipelineStageConfig:
        """These fields as a plain pipeline config: the stages that extend it (fidelity,
        capacity) build every run from it."""
        fields = {name: getattr(self, name) for name in PipelineStageConfig.__dataclass_fields__}
        return PipelineStageConfig(**fields)
