"""The profiler's side of the bundle's data check
(:mod:`gpu_simulate_test.core.profiling.bundle_checks`, re-exported here): which rows of a fresh
profile to time again, the smaller and slower shape of every inversion the check reports."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from gpu_simulate_test.core.profiling.bundle_checks import inversions, inverted, profile_warnings

__all__ = (
    "disturbed",
    "inversions",
    "profile_warnings",
    "slow_sizes",
)


def slow_sizes(
    table: pd.DataFrame,
    size_column: str,
    ops: Sequence[str],
    group_columns: Sequence[str] = (),
) -> set[tuple[Any, ...]]:
    """``(*group values, size)`` of every row some op looks inverted at (the smaller, slower
    shape of each pair :func:`inversions` reports): the rows to time again."""
    found: set[tuple[Any, ...]] = set()
    groups = table.groupby(list(group_columns)) if group_columns else [((), table)]
    for key, group in groups:
        ordered = group.sort_values(size_column)
        sizes = ordered[size_column].to_numpy()
        values = key if isinstance(key, tuple) else (key,)
        for op in ops:
            column = f"time_stats.{op}.median"
            if column in ordered:
                for i, _j in inverted(ordered[column].to_numpy(dtype=float)):
                    found.add((*values, int(sizes[i])))
    return found


def disturbed(
    mlp: pd.DataFrame, attention: pd.DataFrame, mlp_ops: Sequence[str]
) -> tuple[set[int], set[tuple[int, int]], set[tuple[int, int]]]:
    """The rows :func:`profile_warnings` points at: mlp ``num_tokens``, decode
    ``(kv_cache_size, batch_size)`` and prefill ``(kv_cache_size, prefill_chunk_size)``."""
    tokens = {int(t[0]) for t in slow_sizes(mlp, "num_tokens", mlp_ops)}
    decode = attention[attention["prefill_chunk_size"] == 0]
    prefill = attention[attention["prefill_chunk_size"] > 0]
    dec = {
        (int(kv), int(b))
        for kv, b in slow_sizes(decode, "batch_size", ["attn_decode"], ["kv_cache_size"])
    }
    pre = {
        (int(kv), int(c))
        for kv, c in slow_sizes(prefill, "prefill_chunk_size", ["attn_prefill"], ["kv_cache_size"])
    }
    return tokens, dec, pre
