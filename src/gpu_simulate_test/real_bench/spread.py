"""The truth against itself: how closely do real runs of the same job agree?

A simulation judged against one real run cannot be checked more finely than the real runs agree
with each other. Over several runs' TTFT, TPOT and E2E p50s (each run's ``summary.json``, per
clock: the engine's own and the client's), :func:`spread` gives each metric's coefficient of
variation and max / min, how often one run lands within a limit of another on every metric at
once (:func:`pairs_within`), and the most runs one fixed prediction can put within the limit
(:func:`best_prediction`: no simulation can do better against these runs).
``benchmarks/truth/bench_truth_spread.py`` runs the job and prints them.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

CLOCKS: Mapping[str, tuple[str, str, str]] = MappingProxyType(
    {  # summary.json's p50s, per clock
        "engine": ("engine_ttft_ms", "engine_tpot_ms", "engine_e2e_ms"),
        "client": ("p50_ttft_ms", "p50_tpot_ms", "p50_e2el_ms"),
    }
)


def p50s(run_dir: Path) -> dict[str, list[float]]:
    """The run's TTFT, TPOT and E2E p50 (ms) per clock, from its ``summary.json``."""
    summary = json.loads((run_dir / "summary.json").read_text())
    out: dict[str, list[float]] = {}
    for clock, keys in CLOCKS.items():
        values = [summary.get(k) for k in keys]
        values = [v["p50"] if isinstance(v, dict) else v for v in values]
        if all(isinstance(v, (int, float)) for v in values):
            out[clock] = [float(v) for v in values]
    return out


def pairs_within(values: np.ndarray, limit: float) -> tuple[int, int]:
    """Ordered pairs (i, j), i ≠ j, whose every column has ``|v_i / v_j - 1| ≤ limit``, and the
    number of pairs. ``values``: runs × metrics."""
    n = len(values)
    hits = sum(
        bool(np.all(np.abs(values[i] / values[j] - 1.0) <= limit + 1e-12))
        for i, j in itertools.permutations(range(n), 2)
    )
    return hits, n * (n - 1)


def best_prediction(values: np.ndarray, limit: float) -> tuple[int, list[float]]:
    """The most runs one fixed prediction puts within ``limit`` on every column at once, and that
    prediction. Run j is met on column k by any ``p`` in ``[v_jk (1 - limit), v_jk (1 + limit)]``
    (relative to the run), so the best ``p`` of each column is one of those ends."""
    lows, highs = values * (1.0 - limit), values * (1.0 + limit)
    columns = range(values.shape[1])
    candidates = [np.unique(np.concatenate([lows[:, k], highs[:, k]])) for k in columns]
    best, where = 0, [float(np.median(values[:, k])) for k in columns]
    for point in itertools.product(*candidates):
        p = np.asarray(point)
        met = int(np.sum(np.all(np.abs(p / values - 1.0) <= limit + 1e-12, axis=1)))
        if met > best:
            best, where = met, [float(x) for x in p]
    return best, where


def spread(values: np.ndarray, limit: float) -> dict[str, Any]:
    """Every figure of one clock's runs × (TTFT, TPOT, E2E) p50s."""
    hits, pairs = pairs_within(values, limit)
    met, prediction = best_prediction(values, limit)
    fraction = hits / pairs if pairs else float("nan")
    return {
        "runs": len(values),
        "cv": [round(float(c), 4) for c in values.std(axis=0, ddof=1) / values.mean(axis=0)],
        "max_over_min": [round(float(r), 3) for r in values.max(axis=0) / values.min(axis=0)],
        "pairs_within": hits,
        "pairs": pairs,
        "pair_fraction": round(fraction, 4),
        "five_in_a_row": round(fraction**5, 4),
        "best_prediction_meets": met,
        "best_prediction_ms": [round(v, 3) for v in prediction],
    }
