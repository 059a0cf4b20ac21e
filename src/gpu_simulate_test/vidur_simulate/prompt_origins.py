"""What each prompt of a workload is made of, for the prefix cache (:mod:`.v1_prefix`): a shared
prefix (``trace_lengths.csv``'s ``prefix_id``/``prefix_len``) and the request's own tokens."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.vidur_simulate.v1_prefix import Segments


def prompt_segments(lengths: pd.DataFrame, prefill: np.ndarray) -> list[Segments] | None:
    """Per request (row order), its prompt's segments: its shared prefix, if any, then its own
    tokens; None for a workload without shared prefixes (every prompt its own). ``prefill``: the
    prompt lengths simulated (a prefix never longer than its prompt)."""
    if "prefix_id" not in lengths.columns:
        return None
    ids = lengths["prefix_id"].to_numpy()
    plen = lengths["prefix_len"].to_numpy()
    out: list[Segments] = []
    for r, total in enumerate(np.asarray(prefill, dtype=np.int64).tolist()):
        shared = 0
        parts: list[tuple[object, int]] = []
        if not pd.isna(ids[r]) and int(ids[r]) >= 0:
            shared = min(int(plen[r]), total)
            parts.append((("P", int(ids[r])), shared))
        parts.append((("U", r), total - shared))
        out.append(parts)
    return out


def prefix_cache_meta(stats: dict[str, int] | None) -> dict[str, Any] | None:
    """``run_meta.json`` ``prefix_cache``: vLLM's totals and the hit rate (hits / queries, in
    tokens, first admissions: vLLM's ``vllm:prefix_cache_hits`` / ``queries``)."""
    if stats is None:
        return None
    queries = stats["queries"]
    return {**stats, "hit_rate": stats["hits"] / queries if queries else None}
