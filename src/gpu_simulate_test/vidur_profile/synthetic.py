"""Synthetic Vidur profiling bundles: roofline-like times in the real bundle schema, for tests,
benchmarks and examples that simulate without profiling.

``write_synthetic_bundle(root, model, hardware="cpu")`` writes ``mlp.csv``, ``attention.csv`` and
``meta.json`` into ``<root>/<hardware>/<model.name>/`` through the same validating writers and
schemas the ``vidur_profile`` stage uses, so ``load_bundle`` accepts it. Times come from a toy
roofline (compute at ``flops``, memory at ``bandwidth``, a fixed launch cost per op), in ms per
layer, with 1 % deterministic noise.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.config.presets import model_preset
from gpu_simulate_test.config.schema import HardwareConfig, ModelConfig
from gpu_simulate_test.core.profiling.bundle import (
    ATTENTION_TABLE,
    BUNDLE_SCHEMA_VERSION,
    MLP_OPS,
    MLP_TABLE,
    STATS,
)
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import write_csv, write_json

QWEN3_TINY = model_preset("qwen3_tiny")
QWEN3_0_6B = model_preset("qwen3_0_6b")
CPU = HardwareConfig(
    name="cpu", device="cpu", peak_bf16_tflops=1.0, memory_bandwidth_gb_s=20.0, memory_gib=24.0
)
"""A small CPU for simulations from the synthetic bundles written for ``hardware="cpu"``."""


@dataclass(frozen=True)
class Roofline:
    flops: float = 100e9
    """Effective FLOP/s."""
    bandwidth: float = 15e9
    """Bytes/s."""
    launch_ms: float = 0.004


@dataclass(frozen=True)
class SyntheticRanges:
    max_num_tokens: int = 4096
    max_batch_size: int = 128
    max_prefill_chunk: int = 4096
    max_kv_cache_size: int = 4096
    block_size: int = 16


def _op_ms(roof: Roofline, flops: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    return roof.launch_ms + 1e3 * np.maximum(flops / roof.flops, nbytes / roof.bandwidth)


def _matmul_ms(roof: Roofline, tokens: np.ndarray, k: int, n: int) -> np.ndarray:
    return _op_ms(roof, 2.0 * tokens * k * n, 2.0 * (k * n + tokens * k + tokens * n))


def _grid(low: int, high: int, points: int, dense_until: int = 0) -> np.ndarray:
    """Integers from low to high: every value up to ``dense_until``, then geometric."""
    dense = np.arange(low, min(dense_until, high) + 1)
    sparse = np.geomspace(max(low, 1), high, points).round().astype(int)
    return np.unique(np.concatenate([dense, sparse, [low, high]])).astype(int)


def _with_stats(
    name: str, median: np.ndarray, rng: np.random.Generator, stats: tuple[str, ...] = STATS
) -> dict[str, np.ndarray]:
    m = median * (1 + rng.normal(0, 0.01, median.shape))
    spread = {"min": 0.97, "max": 1.05, "mean": 1.01, "median": 1.0, "std": 0.02}
    return {f"time_stats.{name}.{s}": m * spread[s] for s in stats}


def mlp_frame(
    model: ModelConfig, ranges: SyntheticRanges, roof: Roofline, points: int, seed: int
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    h, inter, hd = model.hidden_size, model.intermediate_size, model.head_dim
    q, kv = model.num_attention_heads, model.num_key_value_heads
    t = _grid(1, ranges.max_num_tokens, points, dense_until=16).astype(float)
    medians = {
        "emb": _op_ms(roof, 0 * t, 2 * t * h),
        "input_layernorm": _op_ms(roof, 5 * t * h, 4 * t * h),
        "attn_pre_proj": _matmul_ms(roof, t, h, (q + 2 * kv) * hd),
        "attn_rope": _op_ms(roof, 6 * t * (q + kv) * hd, 4 * t * (q + kv) * hd),
        "attn_post_proj": _matmul_ms(roof, t, q * hd, h),
        "post_attention_layernorm": _op_ms(roof, 5 * t * h, 4 * t * h),
        "mlp_up_proj": _matmul_ms(roof, t, h, 2 * inter),
        "mlp_act": _op_ms(roof, 8 * t * inter, 6 * t * inter),
        "mlp_down_proj": _matmul_ms(roof, t, inter, h),
        "add": _op_ms(roof, t * h, 6 * t * h),
    }
    cols: dict[str, Any] = {}
    for op in MLP_OPS:
        cols |= _with_stats(op, medians[op], rng)
    frame = pd.DataFrame(cols)
    frame["n_head"] = q
    frame["n_kv_head"] = kv
    frame["n_embd"] = h
    frame["n_expanded_embd"] = inter
    frame["vocab_size"] = model.vocab_size
    frame["use_gated_mlp"] = True
    frame["num_tokens"] = t.astype(int)
    frame["num_tensor_parallel_workers"] = 1
    return frame


def attention_frame(
    model: ModelConfig, ranges: SyntheticRanges, roof: Roofline, points: int, seed: int
) -> pd.DataFrame:
    rng = np.random.default_rng(seed + 1)
    hd, q, kv = model.head_dim, model.num_attention_heads, model.num_key_value_heads
    kv_sizes = np.concatenate([[0], _grid(16, ranges.max_kv_cache_size, points)])
    batches = _grid(1, ranges.max_batch_size, points // 2, dense_until=8)
    chunks = _grid(1, ranges.max_prefill_chunk, points, dense_until=4)
    rows = [(int(b), int(k), 0) for k in kv_sizes if k > 0 for b in batches]
    rows += [(1, int(k), int(c)) for k in kv_sizes for c in chunks]
    frame = pd.DataFrame(rows, columns=["batch_size", "kv_cache_size", "prefill_chunk_size"])
    b = frame["batch_size"].to_numpy(float)
    k = frame["kv_cache_size"].to_numpy(float)
    c = frame["prefill_chunk_size"].to_numpy(float)
    prefill = c > 0
    prefill_ms = _op_ms(roof, 4 * q * hd * c * (k + c / 2), 4 * kv * hd * (k + c) + 4 * q * hd * c)
    decode_ms = _op_ms(roof, 4 * q * hd * b * k, 4 * kv * hd * b * k)
    tokens = np.maximum(b, c)
    frame["n_embd"] = model.hidden_size
    frame["n_q_head"] = q
    frame["n_kv_head"] = kv
    frame["block_size"] = ranges.block_size
    frame["num_tensor_parallel_workers"] = 1
    noisy_prefill = prefill_ms * (1 + rng.normal(0, 0.01, len(frame)))
    noisy_decode = decode_ms * (1 + rng.normal(0, 0.01, len(frame)))
    frame["time_stats.attn_prefill.median"] = np.where(prefill, noisy_prefill, np.nan)
    frame["time_stats.attn_decode.median"] = np.where(prefill, np.nan, noisy_decode)
    frame["time_stats.attn.median"] = np.where(prefill, noisy_prefill, noisy_decode)
    frame["time_stats.attn_kv_cache_save.median"] = _op_ms(roof, 0 * tokens, 8 * kv * hd * tokens)
    frame["is_prefill"] = prefill
    return frame


def write_synthetic_bundle(
    profiling_root: Path,
    model: ModelConfig = QWEN3_TINY,
    hardware: str = "cpu",
    ranges: SyntheticRanges | None = None,
    dtype: str = "float32",
    points: int = 16,
    seed: int = 0,
    roofline: Roofline | None = None,
) -> Path:
    """Write a bundle for ``model`` on ``hardware`` and return its directory."""
    ranges = ranges or SyntheticRanges(
        max_num_tokens=model.max_position_embeddings,
        max_kv_cache_size=model.max_position_embeddings,
    )
    roof = roofline or Roofline()
    path = layout.bundle_dir(profiling_root, hardware, model.name)
    write_csv(path / layout.MLP_PROFILE, mlp_frame(model, ranges, roof, points, seed), MLP_TABLE)
    write_csv(
        path / layout.ATTENTION_PROFILE,
        attention_frame(model, ranges, roof, points, seed),
        ATTENTION_TABLE,
    )
    write_json(
        path / layout.BUNDLE_META,
        {
            "schema_version": BUNDLE_SCHEMA_VERSION,
            "model": asdict(model),
            "hardware": hardware,
            "dtype": dtype,
            "device_name": "synthetic roofline",
            "torch_version": None,
            "attn_implementation": "synthetic",
            "timing_method": f"roofline {asdict(roof)}",
            "ranges": asdict(ranges),
            "created_at": "2025-01-01T00:00:00+00:00",
        },
    )
    return path
