"""What a simulation needs, decided before Vidur is imported: sizes, coverage and KV-cache blocks.

Pure functions over our configs, the workload and the bundle; every check here runs before any
long work, and each failure names the knob or the file to change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np
import pandas as pd

from gpu_simulate_test.config.schema import ConfigError, HardwareConfig, ModelConfig
from gpu_simulate_test.config.vidur import VidurPredictorConfig, VidurSchedulerConfig
from gpu_simulate_test.core.profiling.bundle import Bundle
from gpu_simulate_test.io.artifacts import ArtifactError

TRACE_DATE = "2023-08-21"
"""Vidur's trace replay keeps only rows whose ``Date`` equals its config's ``date``."""
TRACE_COLUMNS: tuple[str, ...] = ("Date", "Time", "PromptTokenCount", "CompletionTokenCount")
"""Vidur's trace-replay CSV: ``Time`` is the arrival in seconds, counts are tokens."""
DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"float32": 4, "bfloat16": 2, "float16": 2})
BATCH_TOKEN_ROUNDING = 8
"""Vidur rounds a batch's total query tokens up to a multiple of 8 for per-token op lookups."""


@dataclass(frozen=True)
class Requirements:
    """The largest shapes a simulation can ask the predictor for (all in tokens or requests)."""

    max_request_tokens: int
    """Longest request, prompt + output: the largest KV-cache size."""
    max_prompt_tokens: int
    max_batch_tokens: int
    """Largest total of query tokens in one batch (per-token ops, mlp.csv ``num_tokens``)."""
    max_batch_size: int
    """Largest decode batch (attention.csv ``batch_size``)."""
    max_prefill_chunk: int
    """Largest prefill chunk of one request (attention.csv ``prefill_chunk_size``)."""


def workload_lengths(lengths: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output lengths of a workload's ``trace_lengths`` table, as int64 arrays."""
    return (
        lengths["num_prefill_tokens"].to_numpy(dtype=np.int64),
        lengths["num_decode_tokens"].to_numpy(dtype=np.int64),
    )


def requirements(
    prefill: np.ndarray, decode: np.ndarray, scheduler: VidurSchedulerConfig
) -> Requirements:
    """What ``scheduler`` can ask for on this workload.

    sarathi mixes decodes (1 token each, outside the chunk budget) with prefill chunks filling
    ``chunk_size``; vllm batches whole prompts up to ``max_tokens_in_batch``; orca admits whole
    prompts with no token budget. A restarted (preempted) request re-prefills its prompt plus the
    tokens it had decoded, so whole-prompt schedulers need chunks up to the longest request.
    """
    total = prefill + decode
    max_request = int(total.max())
    max_prompt = int(prefill.max())
    batch_size = min(scheduler.batch_size_cap, len(prefill))
    largest = int(np.sort(total)[::-1][:batch_size].sum())
    if scheduler.name in ("sarathi", "vllm_v1"):
        # several prompts (chunks) can share one batch's budget, next to the decodes
        max_chunk = min(scheduler.chunk_size, max_request)
        max_batch_tokens = max(min(scheduler.chunk_size, largest), batch_size)
    elif scheduler.name == "vllm":
        max_chunk = max_request
        max_batch_tokens = max(min(scheduler.max_tokens_in_batch, largest), batch_size)
    else:  # orca: up to batch_size whole prompts in one iteration
        max_chunk = max_request
        max_batch_tokens = largest
    return Requirements(max_request, max_prompt, max_batch_tokens, batch_size, max_chunk)


def check_context(prefill: np.ndarray, decode: np.ndarray, model: ModelConfig, where: str) -> None:
    """Fail when a request does not fit the model's context."""
    total = prefill + decode
    over = np.flatnonzero(total > model.max_position_embeddings)
    if over.size:
        row = int(over[0])
        raise ArtifactError(
            f"{where}: request {row} has {prefill[row]} prompt + {decode[row]} output tokens, over "
            f"model {model.name}'s max context {model.max_position_embeddings} "
            f"({over.size} request(s) too long)"
        )


def check_scheduler(
    needs: Requirements, scheduler: VidurSchedulerConfig, bundle: Bundle, num_blocks: int
) -> None:
    """Knob combinations under which Vidur would never schedule some request (it would stall)."""
    if scheduler.name == "vllm" and scheduler.max_tokens_in_batch < needs.max_prompt_tokens:
        raise ConfigError(
            f"vidur.scheduler.max_tokens_in_batch={scheduler.max_tokens_in_batch} is below the "
            f"longest prompt ({needs.max_prompt_tokens} tokens): vllm would never schedule it"
        )
    if scheduler.block_size != bundle.ranges.block_size:
        raise ArtifactError(
            f"{bundle.path}: bundle was profiled with block_size={bundle.ranges.block_size}, but "
            f"vidur.scheduler.block_size={scheduler.block_size} (Vidur filters attention.csv by it)"
        )
    blocks_per_request = math.ceil(needs.max_request_tokens / scheduler.block_size)
    if num_blocks < blocks_per_request:
        raise ConfigError(
            f"KV cache of {num_blocks} blocks x {scheduler.block_size} tokens cannot hold the "
            f"longest request ({needs.max_request_tokens} tokens); raise "
            "vidur.scheduler.num_blocks or use a device with more memory"
        )


def check_coverage(needs: Requirements, bundle: Bundle) -> None:
    """Fail, naming every range, when the bundle does not cover what the simulation needs.

    Vidur's random forests do not extrapolate: outside the profiled ranges they return the edge
    value, so a short profile silently underestimates long batches.
    """
    have = bundle.ranges
    ranges = (
        ("tokens per batch", needs.max_batch_tokens, have.max_num_tokens, "max_num_tokens"),
        ("decode batch size", needs.max_batch_size, have.max_batch_size, "max_batch_size"),
        ("prefill chunk", needs.max_prefill_chunk, have.max_prefill_chunk, "max_prefill_chunk"),
        (
            "KV-cache size (longest request)",
            needs.max_request_tokens,
            have.max_kv_cache_size,
            "max_kv_cache_size",
        ),
    )
    short = [(label, need, got, knob) for label, need, got, knob in ranges if need > got]
    if short:
        # the ranges themselves: a workload only widens tokens and chunks to its longest prompt,
        # short of what a batch of several requests (or a re-prefill) asks; every range given,
        # the bundle's where it covers, so the new profile narrows none (a range left out would
        # fall back to the config's default)
        overrides = " ".join(f"profile.{knob}={max(need, got)}" for _, need, got, knob in ranges)
        raise ArtifactError(
            f"{bundle.path}: profiling bundle does not cover this workload and scheduler ("
            + "; ".join(
                f"{label}: needs {need}, bundle has {got} (profile.{knob})"
                for label, need, got, knob in short
            )
            + "); re-profile to cover it, e.g. python -m gpu_simulate_test.cli.vidur_profile "
            f"model={bundle.meta.get('model', {}).get('name', '<model>')} "
            f"hardware={bundle.meta.get('hardware', '<hardware>')} "
            f"profiling_root={bundle.path.parent.parent} {overrides} "
            "output.overwrite=true, or ask less of it with the scheduler's knobs "
            "(vidur.scheduler.batch_size_cap, chunk_size, max_tokens_in_batch)"
        )


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _bucket(value: int, multiple: int) -> int:
    """``value`` rounded up to ``multiple`` × a power of two, so similar workloads share a cache."""
    units = max(1, math.ceil(value / multiple))
    return multiple * (1 << (units - 1).bit_length())


def prediction_bounds(needs: Requirements, predictor: VidurPredictorConfig) -> dict[str, int]:
    """Vidur's ``prediction_max_*``: the eagerly built lookup tables must hold every key.

    Keys are a batch's query tokens rounded up to 8 (per-token ops), (batch size, mean KV size
    rounded up to the granularity) for decode attention and (KV size rounded up, chunk rounded
    up to 32) for prefill attention; a missing key is a KeyError mid-simulation. Sizes are
    bucketed to powers of two so nearby workloads reuse one cache entry.
    """
    granularity = predictor.kv_cache_prediction_granularity
    tokens = max(needs.max_request_tokens, round_up(needs.max_batch_tokens, BATCH_TOKEN_ROUNDING))
    return {
        "prediction_max_tokens_per_request": _bucket(tokens, granularity),
        "prediction_max_prefill_chunk_size": _bucket(
            needs.max_prefill_chunk, predictor.prefill_chunk_granularity
        ),
        "prediction_max_batch_size": _bucket(needs.max_batch_size, 1),
    }


def max_tokens_per_request(needs: Requirements, block_size: int) -> int:
    """Vidur's request-generator ``max_tokens``: the longest request, rounded up to whole blocks.

    It sets the blocks reserved per request (orca) and the memory-bound batch size
    (KV tokens // max_tokens); the model's full context would shrink that bound needlessly.
    """
    return round_up(needs.max_request_tokens, block_size)


def resolve_dtype(bundle: Bundle, hardware: HardwareConfig) -> str:
    """The dtype the bundle was profiled in (``auto``: bfloat16 on CUDA, float32 on CPU)."""
    dtype = str(bundle.meta.get("dtype", "auto"))
    if dtype == "auto":
        dtype = "float32" if hardware.device == "cpu" else "bfloat16"
    if dtype not in DTYPE_BYTES:
        raise ArtifactError(
            f"{bundle.path}: meta.json dtype={dtype!r} is not one of {', '.join(DTYPE_BYTES)}"
        )
    return dtype


def num_parameters(model: ModelConfig) -> int:
    """Qwen3 parameter count: embeddings, attention with q/k norms, SwiGLU MLP, norms, LM head."""
    hidden, head_dim = model.hidden_size, model.head_dim
    attention = hidden * head_dim * (model.num_attention_heads + 2 * model.num_key_value_heads)
    attention += model.num_attention_heads * head_dim * hidden + 2 * head_dim
    mlp = 3 * hidden * model.intermediate_size
    per_layer = attention + mlp + 2 * hidden
    embeddings = model.vocab_size * hidden * (1 if model.tie_word_embeddings else 2)
    return model.num_layers * per_layer + embeddings + hidden


@dataclass(frozen=True)
class KvCachePlan:
    """KV-cache capacity from the true head_dim (Vidur would use hidden / heads)."""

    num_blocks: int
    derived: bool
    """True when computed from device memory; False when vidur.scheduler.num_blocks was given."""
    dtype: str
    kv_bytes_per_token: int
    weight_bytes: int
    available_bytes: int


def kv_cache_plan(
    model: ModelConfig, hardware: HardwareConfig, scheduler: VidurSchedulerConfig, dtype: str
) -> KvCachePlan:
    """Blocks that fit in ``memory_gib × (1 − margin) − weights`` at the true KV bytes per token."""
    factor = DTYPE_BYTES[dtype]
    kv_bytes = model.kv_cache_bytes_per_token * factor // 2
    weights = num_parameters(model) * factor
    available = int(hardware.memory_gib * 2**30 * (1 - scheduler.memory_margin_fraction)) - weights
    if scheduler.num_blocks:
        return KvCachePlan(scheduler.num_blocks, False, dtype, kv_bytes, weights, available)
    if available <= 0:
        raise ConfigError(
            f"model {model.name} ({weights / 2**30:.1f} GiB of {dtype} weights) does not fit in "
            f"hardware {hardware.name} ({hardware.memory_gib} GiB, margin "
            f"{scheduler.memory_margin_fraction})"
        )
    num_blocks = available // (kv_bytes * scheduler.block_size)
    return KvCachePlan(int(num_blocks), True, dtype, kv_bytes, weights, available)


def vidur_token_counts(
    prefill: np.ndarray, decode: np.ndarray, max_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    """The prompt and output tokens as Vidur's trace reader makes them (scale factors 1): at
    least one each, the prompt cut where the two pass ``max_tokens``."""
    prompt = np.maximum(np.asarray(prefill, dtype=np.int64), 1)
    output = np.maximum(np.asarray(decode, dtype=np.int64), 1)
    prompt = prompt - np.maximum(prompt + output - max_tokens, 0)
    return prompt, output


def trace_frame(
    prefill: np.ndarray, decode: np.ndarray, arrival_time_s: np.ndarray
) -> pd.DataFrame:
    """The workload as Vidur's trace-replay CSV (``Time`` in seconds, counts in tokens)."""
    return pd.DataFrame(
        {
            "Date": TRACE_DATE,
            "Time": np.asarray(arrival_time_s, dtype=float),
            "PromptTokenCount": np.asarray(prefill, dtype=np.int64),
            "CompletionTokenCount": np.asarray(decode, dtype=np.int64),
        },
        columns=list(TRACE_COLUMNS),
    )
