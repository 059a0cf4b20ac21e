"""Typed config of the profile stage: time a model's ops on a device, and the real engine's
steps, into a Vidur bundle (``vidur_profile``; re-exported by :mod:`.vidur`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from omegaconf import MISSING

from gpu_simulate_test.config.backends import BackendConfig, HfCbBackendConfig
from gpu_simulate_test.config.schema import (
    DEFAULT_BLOCK_SIZE,
    HardwareConfig,
    ModelConfig,
    OutputConfig,
    ProfilingConfig,
    _check,
    check_block_size,
)
from gpu_simulate_test.io.layout import PROFILING_ROOT


@dataclass(frozen=True)
class ProfileRangesConfig:
    """What the profile covers; Vidur's random forest does not extrapolate beyond it."""

    max_num_tokens: int = 4096
    """Largest token count of one batch for the per-token ops (mlp.csv ``num_tokens``)."""
    max_batch_size: int = 32
    """Largest decode batch (attention.csv ``batch_size`` with ``prefill_chunk_size == 0``)."""
    max_prefill_chunk: int = 1024
    """Largest prefill chunk (attention.csv ``prefill_chunk_size``)."""
    max_kv_cache_size: int = 0
    """Largest context already in the KV cache; 0 means the model's max context."""
    num_points: int = 0
    """Geometric grid points per range (plus half as many linear ones and the small values);
    0 picks 16 on CUDA and 6 on CPU, where big shapes are slow."""
    min_repeats: int = 3
    """Timed repeats every shape gets, even when it exceeds ``shape_time_budget_s``."""
    shape_time_budget_s: float = 0.05
    """Stop repeating a shape (after ``min_repeats``) once its timed repeats took this long."""

    def __post_init__(self) -> None:
        for name in (
            "max_num_tokens",
            "max_batch_size",
            "max_prefill_chunk",
            "min_repeats",
        ):
            value = getattr(self, name)
            _check(value >= 1, f"profile.{name} must be >= 1, got {value}")
        _check(self.max_kv_cache_size >= 0, "profile.max_kv_cache_size must be >= 0")
        _check(self.num_points >= 0, f"profile.num_points must be >= 0, got {self.num_points}")
        _check(
            self.shape_time_budget_s >= 0,
            f"profile.shape_time_budget_s must be >= 0, got {self.shape_time_budget_s}",
        )


@dataclass(frozen=True)
class EngineCalibrationConfig:
    """The serving engine's own per-step cost, measured end to end through the real bench's
    backend (``engine_steps.csv`` in the bundle; read by ``vidur.engine_overhead``)."""

    enable: bool = False
    backend: BackendConfig = field(default_factory=HfCbBackendConfig)
    """The engine and its knobs, as the real bench will run it (``engine.backend.name=<name>``
    picks another engine, with its defaults). hf_cb when none is named: in-process, no server
    to start; the pipeline passes its own backend (vllm by default)."""
    attn_implementation: str = "sdpa"
    beside_neighbours: bool = False
    """``backend.servers=N`` (N > 1): time the engine beside its N - 1 neighbours, every
    calibration request sent to each server at once (engines that share a machine's cores or
    memory). It stands for a fleet whose engines are all busy: on 2 shared CPU cores a decode
    step took 31% longer so, and a validation replay at 1 req/s over 2 servers (a neighbour
    mostly idle) missed it by 34%. Off: one engine timed as alone (a GPU per engine)."""
    prompt_lengths: tuple[int, ...] = ()
    """Single-request prefills to time; () picks 4 lengths up to the engine's token budget."""
    batch_sizes: tuple[int, ...] = ()
    """Decode batches to time; () picks every size up to 16, then every 4th, up to the engine's
    batch cap (1 for hf_generate, which serves one request at a time)."""
    mixed: bool = True
    """Also time a prefill joining running decodes (not for hf_generate), so a busy engine's
    prefill is not charged the idle engine's wake-up."""
    bursts: bool = True
    """Also send 2, 4 and 8 prompts at once, on an idle engine and next to running decodes, and
    time every step that prefilled several of them (not for hf_generate): a burst's steps carry
    several prompts, which one-prompt experiments leave to extrapolation."""
    decode_prompt_tokens: int = 32
    """Prompt length of the requests in the decode batches."""
    decode_tokens: int = 16
    """Output tokens per calibration request; the first half is skipped as ramp-up."""
    repeats: int = 3
    """Each experiment runs this often; the step time is the median over all repeats."""
    serving_rates: tuple[float, ...] = (0.02, 0.05, 0.3, 0.6)
    """Calibration replays under load (a vLLM server that records its steps): Poisson
    workloads at these fractions of the capacity the decode experiments imply; their steps
    (``serving_steps.csv``) calibrate what serving adds to a step's time. () skips them. The
    quietest (2%, calibration version 16 on) is for the wake-ups after long idles: at 5% most
    idles were under 200 ms, where a main job's are 100 ms to a second."""
    serving_duration_s: float = 3.0
    """Each calibration replay lasts about this long (at least 8 requests)."""
    serving_rounds: int = 3
    """Every rate is replayed this often, the rates interleaved round by round: a host's speed
    drifts by several percent within minutes, and one short replay per rate caught it (stretch
    1.11 to 1.19 in three fresh calibrations of one machine)."""
    serving_max_requests: int = 400
    serving_seed: int = 104729
    """Seed of the calibration replays' arrivals and lengths: keep it apart from the seeds of
    the workloads a simulation is judged on."""

    def __post_init__(self) -> None:
        for name in ("prompt_lengths", "batch_sizes"):
            values = getattr(self, name)
            _check(
                all(int(v) >= 1 for v in values), f"engine.{name} must all be >= 1, got {values}"
            )
        _check(self.decode_prompt_tokens >= 1, "engine.decode_prompt_tokens must be >= 1")
        _check(
            self.decode_tokens >= 4, f"engine.decode_tokens must be >= 4, got {self.decode_tokens}"
        )
        _check(self.repeats >= 1, f"engine.repeats must be >= 1, got {self.repeats}")
        _check(
            all(0 < float(r) < 1 for r in self.serving_rates),
            f"engine.serving_rates must be fractions of capacity in (0, 1), got "
            f"{self.serving_rates}",
        )
        _check(self.serving_duration_s > 0, "engine.serving_duration_s must be > 0")
        _check(self.serving_rounds >= 1, "engine.serving_rounds must be >= 1")
        _check(self.serving_max_requests >= 8, "engine.serving_max_requests must be >= 8")


@dataclass(frozen=True)
class VidurProfileStageConfig:
    """``vidur_profile``: time a Qwen3 decoder layer's ops on a device into a Vidur bundle."""

    model: ModelConfig = MISSING
    hardware: HardwareConfig = MISSING
    profiling: ProfilingConfig = field(default_factory=ProfilingConfig)
    profile: ProfileRangesConfig = field(default_factory=ProfileRangesConfig)
    block_size: int = DEFAULT_BLOCK_SIZE
    """KV-cache block size recorded in attention.csv (tokens)."""
    profiling_root: str = PROFILING_ROOT
    """The bundle lands in ``<profiling_root>/<hardware.name>/<model.name>/``."""
    workload_dir: str | None = None
    """Optional workload run: its longest request widens the ranges to cover it."""
    engine: EngineCalibrationConfig = field(default_factory=EngineCalibrationConfig)
    """Also time the real engine's steps (what per-op profiles miss: LM head, sampling, the
    engine's Python); calibrations of other backends already in the bundle are kept."""
    output: OutputConfig = field(default_factory=OutputConfig)
    progress: bool = True

    def __post_init__(self) -> None:
        check_block_size("block_size", self.block_size)
