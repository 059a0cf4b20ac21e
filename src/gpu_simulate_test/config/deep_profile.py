"""Typed config of the ``deep_profile`` stage: static analysis, torch profiler, Nsight, report."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from gpu_simulate_test.config.real_bench import ATTN_IMPLEMENTATIONS
from gpu_simulate_test.config.schema import (
    DTYPES,
    HardwareConfig,
    LengthDistConfig,
    ModelConfig,
    OutputConfig,
    WorkloadConfig,
    _check,
    _check_choice,
)

PROFILER_ACTIVITIES: tuple[str, ...] = ("cpu", "cuda")
SORT_KEYS: tuple[str, ...] = ("auto", "device", "cpu")
NSYS_CAPTURE_RANGES: tuple[str, ...] = ("none", "nvtx")


@dataclass(frozen=True)
class StaticAnalysisStep:
    """Analytic params, FLOPs, bytes and roofline time for the workload's lengths."""

    enable: bool = True
    prompt_lens: tuple[int, ...] = ()
    """Prompt lengths to tabulate; empty takes the distinct prompt lengths of the requests."""
    context_lens: tuple[int, ...] = ()
    """Decode context lengths; empty takes each request's first and last decode context."""
    batch_sizes: tuple[int, ...] = (1,)

    def __post_init__(self) -> None:
        for name in ("prompt_lens", "batch_sizes"):
            values = getattr(self, name)
            _check(all(v >= 1 for v in values), f"pipeline.static_analysis.{name} must be >= 1")
        _check(
            all(v >= 0 for v in self.context_lens),
            "pipeline.static_analysis.context_lens must be >= 0",
        )
        _check(bool(self.batch_sizes), "pipeline.static_analysis.batch_sizes must not be empty")


@dataclass(frozen=True)
class TorchProfilerStep:
    """The representative requests, prefill + decode steps, under ``torch.profiler``."""

    enable: bool = True
    activities: tuple[str, ...] = ("cpu", "cuda")
    """Profiler activities; ``cuda`` is dropped (and said so) when no GPU is in use."""
    num_warmup_requests: int = 1
    """Requests served before anything is timed (shaped like the first one)."""
    timing_pass: bool = True
    """Time the phases in a separate pass without the profiler (its overhead skews timings)."""
    top_n: int = 20
    """Rows of the operator tables."""
    sort_by: str = "auto"
    """auto (device time when CUDA was profiled, else CPU), device or cpu."""
    record_shapes: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    chrome_trace: bool = True
    """Write ``trace.json`` (open in chrome://tracing or Perfetto)."""

    def __post_init__(self) -> None:
        _check(bool(self.activities), "pipeline.torch_profiler.activities must not be empty")
        for activity in self.activities:
            _check_choice("pipeline.torch_profiler.activities[]", activity, PROFILER_ACTIVITIES)
        _check(self.num_warmup_requests >= 0, "pipeline.torch_profiler.num_warmup_requests >= 0")
        _check(self.top_n >= 1, f"pipeline.torch_profiler.top_n must be >= 1, got {self.top_n}")
        _check_choice("pipeline.torch_profiler.sort_by", self.sort_by, SORT_KEYS)


@dataclass(frozen=True)
class RunWorkloadStep:
    """Serve the requests with NVTX ranges and nothing else: the app nsys and ncu profile."""

    enable: bool = False
    """Off in normal runs; the nsys/ncu steps re-invoke the stage with only this step on."""
    num_warmup_requests: int = 1
    nvtx_range: str = "deep_profile_workload"
    """NVTX range around the timed requests (nsys ``--capture-range=nvtx`` gates on it)."""

    def __post_init__(self) -> None:
        _check(self.num_warmup_requests >= 0, "pipeline.run_workload.num_warmup_requests >= 0")
        _check(bool(self.nvtx_range.strip()), "pipeline.run_workload.nvtx_range must not be empty")


@dataclass(frozen=True)
class NsysStep:
    """``nsys profile`` around the workload app, then ``nsys stats`` parsed to tables."""

    enable: bool = True
    trace: tuple[str, ...] = ("cuda", "nvtx", "osrt")
    capture_range: str = "nvtx"
    """none (whole process, model load included) or nvtx (only pipeline.run_workload.nvtx_range)."""
    top_k: int = 5
    """Kernels listed in ``top_kernels.yaml`` for the ncu step."""
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        _check(bool(self.trace), "pipeline.nsys.trace must not be empty")
        _check_choice("pipeline.nsys.capture_range", self.capture_range, NSYS_CAPTURE_RANGES)
        _check(self.top_k >= 1, f"pipeline.nsys.top_k must be >= 1, got {self.top_k}")
        _check(self.timeout_s > 0, "pipeline.nsys.timeout_s must be > 0")


@dataclass(frozen=True)
class NcuStep:
    """``ncu`` on kernels inside an NVTX range (the nsys top-k kernels when there are some)."""

    enable: bool = True
    preset: str = "kernel_overview"
    """roofline, kernel_overview or full (profiling.nsight.commands.NCU_PRESETS)."""
    nvtx_range: str = "decode"
    """Push/pop range whose kernels are profiled: prefill or decode (set by the engine loop)."""
    use_top_kernels: bool = True
    """Restrict to the nsys step's top-k kernels when its summary exists."""
    launch_count: int = 50
    """Most kernel launches profiled (ncu replays each one, so this bounds the run time)."""
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        _check_choice("pipeline.ncu.preset", self.preset, ("roofline", "kernel_overview", "full"))
        _check(bool(self.nvtx_range.strip()), "pipeline.ncu.nvtx_range must not be empty")
        _check(self.launch_count >= 1, "pipeline.ncu.launch_count must be >= 1")
        _check(self.timeout_s > 0, "pipeline.ncu.timeout_s must be > 0")


@dataclass(frozen=True)
class DeepProfilePipeline:
    """Which steps run (``<step>.enable``) and their options; they always run in field order."""

    static_analysis: StaticAnalysisStep = field(default_factory=StaticAnalysisStep)
    torch_profiler: TorchProfilerStep = field(default_factory=TorchProfilerStep)
    run_workload: RunWorkloadStep = field(default_factory=RunWorkloadStep)
    nsys: NsysStep = field(default_factory=NsysStep)
    ncu: NcuStep = field(default_factory=NcuStep)


def _small_synthetic() -> WorkloadConfig:
    return WorkloadConfig(
        num_requests=4,
        qps=1000.0,
        prompt_len=LengthDistConfig(kind="fixed", value=64, max=4096),
        output_len=LengthDistConfig(kind="fixed", value=16, max=4096),
    )


@dataclass(frozen=True)
class DeepProfileStageConfig:
    """``deep_profile``: where the time goes, from formulas down to kernels, for one workload."""

    model: ModelConfig = MISSING
    hardware: HardwareConfig = MISSING
    workload_dir: str | None = None
    """A workload run (``tmp/workload/<run_id>``) whose first ``num_requests`` are profiled;
    None builds the small synthetic ``workload`` below instead."""
    workload: WorkloadConfig = field(default_factory=_small_synthetic)
    """Used only without ``workload_dir``: a few short requests so the stage takes seconds."""
    num_requests: int = 4
    """Requests profiled (the first N of the workload)."""
    dtype: str = "auto"
    """float32, bfloat16, float16, or auto (bfloat16 on CUDA, float32 on CPU)."""
    attn_implementation: str = "sdpa"
    pipeline: DeepProfilePipeline = field(default_factory=DeepProfilePipeline)
    output: OutputConfig = field(default_factory=OutputConfig)
    progress: bool = True
    """Print step progress and where the artifacts went."""

    def __post_init__(self) -> None:
        _check(self.num_requests >= 1, f"num_requests must be >= 1, got {self.num_requests}")
        _check(
            self.dtype == "auto" or self.dtype in DTYPES,
            f"dtype={self.dtype!r} is not one of auto, {', '.join(DTYPES)}",
        )
        _check_choice("attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
