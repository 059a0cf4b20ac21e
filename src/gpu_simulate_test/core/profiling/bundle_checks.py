"""A profiling bundle's data check: an op must not take many times longer on a smaller shape.

An op's cost grows (or stays flat) with the tokens, batch or chunk it is given. On a busy machine
a stretch of shapes can be timed while another job holds the cores, and the profile then says,
for instance, that a projection takes 44 ms on 2 tokens and 0.13 ms on 147. The simulator would
believe it. These checks find such inversions. The profiler runs them on a fresh profile, re-times
the shapes they point at and records what is left in ``meta.json`` ``quality_warnings``; every
load of a bundle runs them again (:func:`gpu_simulate_test.core.profiling.bundle.load_bundle`), so
a table changed after it was checked is not simulated in silence.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

INVERSION_FACTOR = 5.0
"""How many times a smaller shape may take longer than a larger one before it is reported;
noise on small, launch-bound shapes stays well under this."""
MIN_EXCESS_MS = 0.05
"""Differences below this are timer noise whatever their ratio."""


def inverted(times: np.ndarray) -> list[tuple[int, int]]:
    """``(i, j)`` for every size ``i`` whose time exceeds ``INVERSION_FACTOR`` times that of the
    cheapest larger size ``j`` (``times`` ordered by size)."""
    out = []
    for i in range(len(times) - 1):
        j = i + 1 + int(times[i + 1 :].argmin())  # the cheapest larger shape
        if times[i] > INVERSION_FACTOR * times[j] and times[i] - times[j] > MIN_EXCESS_MS:
            out.append((i, j))
    return out


def inversions(
    table: pd.DataFrame,
    size_column: str,
    ops: Sequence[str],
    where: str,
    group_columns: Sequence[str] = (),
) -> list[str]:
    """One line per op (and group) whose median at some size exceeds ``INVERSION_FACTOR`` times
    its median at a larger size, naming the worst such pair and how many sizes are affected."""
    found: list[str] = []
    groups = table.groupby(list(group_columns)) if group_columns else [((), table)]
    for key, group in groups:
        ordered = group.sort_values(size_column)
        sizes = ordered[size_column].to_numpy()
        label = _group_label(group_columns, key)
        for op in ops:
            column = f"time_stats.{op}.median"
            if column not in ordered:
                continue
            times = ordered[column].to_numpy(dtype=float)
            worst: tuple[float, int, int] | None = None
            pairs = inverted(times)
            affected = len(pairs)
            for i, j in pairs:
                ratio = times[i] / max(times[j], 1e-12)
                if worst is None or ratio > worst[0]:
                    worst = (ratio, i, j)
            if worst is not None:
                ratio, i, j = worst
                found.append(
                    f"{where}: {op}{label} takes {times[i]:.3g} ms at {size_column}={sizes[i]} "
                    f"but {times[j]:.3g} ms at {sizes[j]} ({ratio:.0f}x; {affected} size(s) "
                    "affected)"
                )
    return found


def _group_label(columns: Sequence[str], key: object) -> str:
    if not columns:
        return ""
    values = key if isinstance(key, tuple) else (key,)
    return " (" + ", ".join(f"{c}={v}" for c, v in zip(columns, values, strict=True)) + ")"


def profile_warnings(
    mlp: pd.DataFrame, attention: pd.DataFrame, mlp_ops: Sequence[str]
) -> list[str]:
    """Inversions in ``mlp.csv`` (over num_tokens) and ``attention.csv`` (decode over the batch at
    each KV size, prefill over the chunk at each KV size), each line naming the file, the op and
    the row (its size, and its KV size for attention)."""
    found = inversions(mlp, "num_tokens", mlp_ops, "mlp.csv")
    decode = attention[attention["prefill_chunk_size"] == 0]
    prefill = attention[attention["prefill_chunk_size"] > 0]
    found += inversions(decode, "batch_size", ["attn_decode"], "attention.csv", ["kv_cache_size"])
    found += inversions(
        prefill, "prefill_chunk_size", ["attn_prefill"], "attention.csv", ["kv_cache_size"]
    )
    return found
