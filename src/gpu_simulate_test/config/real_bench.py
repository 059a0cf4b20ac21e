"""Typed config of the ``real_bench`` stage: replay a workload against a real serving engine.

The engines' own configs live in :mod:`gpu_simulate_test.config.backends` (re-exported here)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from gpu_simulate_test.config.backends import (
    BACKEND_NAMES,
    BACKENDS,
    CLIENTS,
    DEFAULT_BACKEND,
    EXACT_LENGTH_MODES,
    SERVER_KINDS,
    BackendConfig,
    BatchingBackendConfig,
    HfCbBackendConfig,
    HfGenerateBackendConfig,
    HttpBackendConfig,
    OpenAIBackendConfig,
    ServerConfig,
    VllmBackendConfig,
    VllmEngineBackendConfig,
)
from gpu_simulate_test.config.schema import (
    DTYPES,
    ConfigError,
    GoodputConfig,
    HardwareConfig,
    ModelConfig,
    OutputConfig,
    _check,
    _check_choice,
)

__all__ = (
    "ATTN_IMPLEMENTATIONS",
    "BACKENDS",
    "BACKEND_NAMES",
    "CLIENTS",
    "DEFAULT_BACKEND",
    "EXACT_LENGTH_MODES",
    "SERVER_KINDS",
    "BackendConfig",
    "BatchingBackendConfig",
    "HfCbBackendConfig",
    "HfGenerateBackendConfig",
    "HttpBackendConfig",
    "OpenAIBackendConfig",
    "RealBenchStageConfig",
    "ServerConfig",
    "VllmBackendConfig",
    "VllmEngineBackendConfig",
)

ATTN_IMPLEMENTATIONS: tuple[str, ...] = (
    "sdpa",
    "eager",
    "paged|eager",
    "flash_attention_2",
    "flash_attention_3",
)


@dataclass(frozen=True)
class RealBenchStageConfig:
    """``real_bench``: replay a workload run at its arrival times and time every token."""

    model: ModelConfig = MISSING
    hardware: HardwareConfig = MISSING
    backend: BackendConfig = field(default_factory=VllmBackendConfig)
    """The engine (``backend=<name>``: one of :data:`BACKENDS`) and its knobs; vllm when none is
    named (the ``real_bench`` command's YAML names hf_cb)."""
    workload_dir: str = MISSING
    """The workload run to replay (``tmp/workload/<run_id>``)."""
    dtype: str = "auto"
    """float32, bfloat16, float16, or auto (bfloat16 on CUDA, float32 on CPU)."""
    attn_implementation: str = "sdpa"
    """Attention kernel of in-process backends."""
    num_warmup_requests: int = 2
    """Requests sent (and discarded) before the clock starts: the workload's first ones."""
    max_requests: int = 0
    """Replay only the first N requests of the workload; 0 replays all."""
    telemetry_interval_s: float = 0.1
    """GPU telemetry (NVML) sampling period; nothing is sampled without a GPU."""
    nvtx: bool = True
    """NVTX ranges around prefill and decode steps when the ``nvtx`` package and CUDA are there."""
    goodput: GoodputConfig = field(default_factory=GoodputConfig)
    """Goals per request (ms) for ``request_goodput``, as ``vllm bench serve --goodput``:
    ``goodput.ttft=500 goodput.tpot=50 goodput.e2el=1000`` (any subset; none: not reported)."""
    output: OutputConfig = field(default_factory=OutputConfig)
    progress: bool = True
    """Show the live progress bar and the summary table."""

    def __post_init__(self) -> None:
        if not self.workload_dir:
            raise ConfigError("workload_dir is required: pass workload_dir=tmp/workload/<run_id>")
        _check(
            self.dtype == "auto" or self.dtype in DTYPES,
            f"dtype={self.dtype!r} is not one of auto, {', '.join(DTYPES)}",
        )
        _check_choice("attn_implementation", self.attn_implementation, ATTN_IMPLEMENTATIONS)
        _check(self.num_warmup_requests >= 0, "num_warmup_requests must be >= 0")
        _check(self.max_requests >= 0, "max_requests must be >= 0")
        _check(self.telemetry_interval_s > 0, "telemetry_interval_s must be > 0")
