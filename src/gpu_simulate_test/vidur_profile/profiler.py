"""Time every shape of a grid on one decoder layer into Vidur's two tables (mlp, attention)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from gpu_simulate_test.core.profiling.bundle import MLP_OPS
from gpu_simulate_test.core.profiling.grid import ProfileGrid
from gpu_simulate_test.vidur_profile.layer_ops import (
    QwenLayer,
    decode_attention,
    kv_cache_save,
    prefill_attention,
    token_ops,
)
from gpu_simulate_test.vidur_profile.timing import TimingPolicy, TimingStats, measure

TENSOR_PARALLEL_WORKERS = 1
"""One device per replica: this profiler does not shard the layer."""


@dataclass(frozen=True)
class ProfileTables:
    mlp: pd.DataFrame
    attention: pd.DataFrame


def _mlp_row(q: QwenLayer, num_tokens: int, policy: TimingPolicy) -> dict[str, object]:
    m = q.model
    row: dict[str, object] = {
        "n_head": m.num_attention_heads,
        "n_kv_head": m.num_key_value_heads,
        "n_embd": m.hidden_size,
        "n_expanded_embd": m.intermediate_size,
        "vocab_size": m.vocab_size,
        "use_gated_mlp": True,
        "num_tokens": num_tokens,
        "num_tensor_parallel_workers": TENSOR_PARALLEL_WORKERS,
    }
    ops = token_ops(q, num_tokens)
    for op in MLP_OPS:
        row.update(measure(ops[op], q.device, policy).as_vidur(op))
    return row


def profile_tables(
    q: QwenLayer,
    grid: ProfileGrid,
    block_size: int,
    policy: TimingPolicy,
    advance: Callable[[int], None] = lambda _n: None,
) -> ProfileTables:
    """Time the per-token ops at every ``grid.num_tokens`` and attention at every decode and
    prefill shape; ``advance(1)`` is called after each shape (for a progress bar)."""
    import torch

    with torch.inference_mode():
        mlp_rows = []
        for num_tokens in grid.num_tokens:
            mlp_rows.append(_mlp_row(q, num_tokens, policy))
            advance(1)

        m = q.model
        fixed = {
            "n_embd": m.hidden_size,
            "n_q_head": m.num_attention_heads,
            "n_kv_head": m.num_key_value_heads,
            "block_size": block_size,
            "num_tensor_parallel_workers": TENSOR_PARALLEL_WORKERS,
        }
        # the cache write depends only on how many tokens are written: time each count once
        saves: dict[tuple[bool, int], TimingStats] = {}

        def save_time(num_tokens: int, decode: bool) -> float:
            key = (decode, num_tokens)
            if key not in saves:
                saves[key] = measure(
                    kv_cache_save(q, num_tokens, block_size, decode), q.device, policy
                )
            return saves[key].median_ms

        nan = float("nan")
        attention_rows = []
        for batch_size, kv in grid.decode_shapes:
            attn = measure(decode_attention(q, batch_size, kv), q.device, policy).median_ms
            attention_rows.append(
                {
                    **fixed,
                    "batch_size": batch_size,
                    "kv_cache_size": kv,
                    "prefill_chunk_size": 0,
                    "time_stats.attn_prefill.median": nan,
                    "time_stats.attn_decode.median": attn,
                    "time_stats.attn.median": attn,
                    "time_stats.attn_kv_cache_save.median": save_time(batch_size, decode=True),
                }
            )
            advance(1)
        for chunk, kv in grid.prefill_shapes:
            attn = measure(prefill_attention(q, chunk, kv), q.device, policy).median_ms
            attention_rows.append(
                {
                    **fixed,
                    "batch_size": 1,
                    "kv_cache_size": kv,
                    "prefill_chunk_size": chunk,
                    "time_stats.attn_prefill.median": attn,
                    "time_stats.attn_decode.median": nan,
                    "time_stats.attn.median": attn,
                    "time_stats.attn_kv_cache_save.median": save_time(chunk, decode=False),
                }
            )
            advance(1)
    return ProfileTables(pd.DataFrame(mlp_rows), pd.DataFrame(attention_rows))
