"""The configurations ranked, the Pareto frontier and the table every output is written from."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pandas as pd

from gpu_simulate_test.capacity.search import METRICS
from gpu_simulate_test.capacity.seeds import spread
from gpu_simulate_test.config.vidur import derived_seed
from gpu_simulate_test.tune import contract
from gpu_simulate_test.tune.simulate import Simulated
from gpu_simulate_test.tune.space import TUNE_KNOBS_ORDER


def score(sim: Simulated, objective: str) -> float:
    """What the ranking maximizes: the capacity, or the goodput at ``tune.qps``; -1 when none
    (no rate met the goals, or it was not simulated)."""
    value = sim.capacity if objective == "capacity" else sim.goodput
    return -1.0 if value is None else float(value)


def latency_at(sim: Simulated, metric: str, percentile: int) -> float:
    """``metric`` at ``percentile`` at the shared rate (inf when not simulated there)."""
    if sim.at_rate is None:
        return math.inf
    value = float(sim.at_rate.latency_ms.get(f"{metric}_p{percentile}", math.nan))
    return value if math.isfinite(value) else math.inf


def ranked(results: list[Simulated], objective: str, key_metric: str, pct: int) -> list[Simulated]:
    """Best first: the highest score, then the lower latency of the first goal's metric at the
    shared rate (the same load served with more headroom); the invalid ones last."""
    return sorted(
        results,
        key=lambda s: (
            bool(s.error),
            -score(s, objective),
            latency_at(s, key_metric, pct),
            s.candidate.config_id,
        ),
    )


def pareto(points: list[tuple[str, float, float]]) -> list[str]:
    """The ids on the frontier of (id, capacity to maximize, latency to minimize): no other
    point has at least the capacity and at most the latency, one of them strictly."""
    front = []
    for name, cap, lat in points:
        dominated = any(
            (c >= cap and lt <= lat) and (c > cap or lt < lat) for n, c, lt in points if n != name
        )
        if not dominated:
            front.append(name)
    return front


def table(
    order: list[Simulated],
    pct: int,
    shared: float | None,
    measured: Mapping[str, Mapping[str, Any]] | None = None,
) -> pd.DataFrame:
    """``tune.csv``: one row per configuration in rank order."""
    rows = []
    for rank, sim in enumerate(order, 1):
        c, answer = sim.candidate, sim.answer
        row: dict[str, Any] = {"rank": rank, "config_id": c.config_id, "configured": c.configured}
        row.update({name: c.knobs[name] for name in TUNE_KNOBS_ORDER})
        row["replicas"], row["router"] = c.replicas, c.routed_by
        row["capacity_qps"] = None if answer is None else answer.qps
        row["capacity_high_qps"] = None if answer is None else answer.bracket[1]
        low, high = seed_range(sim) if answer is not None else (None, None)
        row["capacity_seed_low_qps"], row["capacity_seed_high_qps"] = low, high
        per_gpu = None if answer is None or answer.qps is None else answer.qps / c.replicas
        row["capacity_per_gpu_qps"] = None if per_gpu is None else round(per_gpu, 3)
        row["rate_qps"] = None if sim.at_rate is None else sim.at_rate.qps
        if shared is not None and sim.at_rate is None and not sim.error:
            row["rate_qps"] = shared
        for metric in METRICS:
            value = latency_at(sim, metric, pct)
            row[f"{metric}_ms"] = round(value, 3) if math.isfinite(value) else None
        row["goodput_qps"] = sim.goodput
        row["binding"] = "; ".join(sim.binding())
        row["simulations"] = sim.simulations
        real = (measured or {}).get(c.config_id) or {}
        row["measured_qps"] = real.get("measured_qps")
        bracket = real.get("measured_bracket_qps") or [None, None]
        row["measured_high_qps"] = bracket[1]
        row["invalid"] = sim.error
        rows.append(row)
    return pd.DataFrame(rows, columns=contract.TUNE_TABLE.column_names)


def seed_range(sim: Simulated) -> tuple[float | None, float | None]:
    """The lowest and highest score over a result's noise seeds that met the goals (None, None:
    one seed, or none met them)."""
    met = [v for v in sim.seed_scores if v > 0]
    return (min(met), max(met)) if met else (None, None)


def seeds_record(order: list[Simulated], count: int, first_seed: int) -> dict[str, Any]:
    """``tune.json`` ``sim_seeds``: the seeds, each configuration's score under each (-1: no
    rate met the goals), the spread of each (max / min − 1) and its median over the space."""
    scores = {s.candidate.config_id: list(s.seed_scores) for s in order if s.seed_scores}
    spreads = {c: spread([v for v in values if v > 0]) for c, values in scores.items()}
    known = sorted(v for v in spreads.values() if v is not None)
    return {
        "count": count,
        "seeds": [derived_seed(first_seed, k) for k in range(count)],
        "scores": scores,
        "spread": spreads,
        "median_spread": known[(len(known) - 1) // 2] if known else None,
    }


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (average ranks for ties); None under 3 pairs or no spread."""
    if len(xs) < 3:
        return None
    a = pd.Series(xs).rank().to_numpy()
    b = pd.Series(ys).rank().to_numpy()
    if a.std() == 0 or b.std() == 0:
        return None
    return float(((a - a.mean()) * (b - b.mean())).mean() / (a.std() * b.std()))
