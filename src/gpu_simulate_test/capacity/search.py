"""The simulated search, pure: a geometric grid of rates for the curve, then bisection between
the last rate that met the goals and the first that did not. Each evaluation is one simulation:
:func:`judged_point` judges its request table (a real run's too: the real search,
:mod:`.bracket`, steps from a seed instead of a grid)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gpu_simulate_test.config.capacity import SloConfig
from gpu_simulate_test.core.metrics.goodput import rate_of, table_goodput
from gpu_simulate_test.core.metrics.percentiles import latency_ms

METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e")
"""The metrics every rate's percentiles are read for."""


@dataclass(frozen=True)
class Point:
    """One evaluated rate: its latency percentiles (ms) and whether every goal was met."""

    qps: float
    phase: str
    """``grid`` or ``refine``."""
    latency_ms: Mapping[str, float]
    """``<metric>_p<q>`` → ms, e.g. ``ttft_p90``."""
    meets: bool
    violated: tuple[str, ...] = ()
    """The goals it missed (``ttft_p90 143.2 > 100``)."""
    wall_s: float = 0.0
    goodput_qps: float | None = None
    """Requests that met every goal per request, per second (``vllm bench serve --goodput``)."""


@dataclass(frozen=True)
class Answer:
    """The highest rate that met the goals, and how sure the search is of it."""

    qps: float | None
    """None: not even ``qps_min`` met them."""
    bracket: tuple[float, float | None]
    """(the highest rate that met the goals, the lowest that did not; None: none failed)."""
    points: tuple[Point, ...] = field(default_factory=tuple)
    note: str = ""


def grid(qps_min: float, qps_max: float, points: int) -> list[float]:
    """``points`` rates from ``qps_min`` to ``qps_max``, evenly spaced on a log scale (4
    significant digits)."""
    return [float(f"{q:.4g}") for q in np.geomspace(qps_min, qps_max, points)]


def judge(
    latency_ms: Mapping[str, float], goals: Mapping[str, float], percentile: int
) -> tuple[bool, tuple[str, ...]]:
    """Whether ``latency_ms`` meets every goal (``metric`` → ms at ``percentile``); the misses.
    A NaN percentile (no request had the metric) is a miss."""
    missed = []
    for metric, goal in goals.items():
        key = f"{metric}_p{percentile}"
        value = float(latency_ms[key])
        if not value <= goal:
            missed.append(f"{key} {value:.1f} > {goal:g}")
    return not missed, tuple(missed)


def rounded(qps: float) -> float:
    """A rate to 4 significant digits, as every search's rates are (simulated and real)."""
    return float(f"{qps:.4g}")


def search(
    evaluate: Callable[[float, str], Point],
    qps_min: float,
    qps_max: float,
    points: int,
    refine: int,
    extend: int = 0,
    unit: str = "req/s",
) -> Answer:
    """Evaluate the grid, then bisect between the last rate that met the goals and the first
    that did not (``refine`` steps). The goals are assumed to get harder with the rate; where
    the grid says otherwise (a miss below a pass), the answer stays below the first miss and
    the note says so.

    Where the capacity lies outside the grid (even ``qps_min`` misses, or ``qps_max`` still
    meets), the grid goes on past that end at its own spacing, up to ``extend`` rates. The note
    says what was extended, its rates in ``unit`` (sessions/s for a multi-turn workload)."""
    rates = grid(qps_min, qps_max, points)
    ratio = (qps_max / qps_min) ** (1.0 / (points - 1))
    evaluated = [evaluate(qps, "grid") for qps in rates]
    notes = _extend(evaluate, evaluated, ratio, extend, unit)
    first_miss = next((i for i, p in enumerate(evaluated) if not p.meets), None)
    if first_miss is not None and any(p.meets for p in evaluated[first_miss + 1 :]):
        notes.insert(
            0,
            f"not monotone: {evaluated[first_miss].qps:g} {unit} missed the goals while a higher "
            "rate met them (a short workload is noisy at its tail); the answer stays below the "
            "first miss",
        )
    note = "; ".join(notes)
    lowest, highest = evaluated[0].qps, evaluated[-1].qps
    if first_miss == 0:
        why = f"even {lowest:g} {unit} misses the goals: lower capacity.qps_min"
        return Answer(None, (0.0, lowest), tuple(evaluated), f"{note}; {why}" if note else why)
    if first_miss is None:
        why = f"{highest:g} {unit} still meets the goals: raise capacity.qps_max"
        return Answer(highest, (highest, None), tuple(evaluated), f"{note}; {why}" if note else why)
    low, high = evaluated[first_miss - 1].qps, evaluated[first_miss].qps
    for _ in range(refine):
        middle = rounded(np.sqrt(low * high))  # geometric: the grid's own spacing
        if not low < middle < high:
            break
        point = evaluate(middle, "refine")
        evaluated.append(point)
        if point.meets:
            low = middle
        else:
            high = middle
    ordered = tuple(sorted(evaluated, key=lambda p: p.qps))
    return Answer(low, (low, high), ordered, note)


def _extend(
    evaluate: Callable[[float, str], Point],
    evaluated: list[Point],
    ratio: float,
    extend: int,
    unit: str = "req/s",
) -> list[str]:
    """Go on past the end of the grid where the capacity lies (below while even the lowest rate
    misses, above while every rate meets), up to ``extend`` rates at the grid's spacing, adding
    them to ``evaluated`` in order; the notes saying what was extended."""
    notes = []
    added: list[float] = []
    while len(added) < extend and not evaluated[0].meets:
        qps = rounded(evaluated[0].qps / ratio)
        evaluated.insert(0, evaluate(qps, "grid"))
        added.append(qps)
    if added:
        notes.append(f"the grid extended below capacity.qps_min to {added[-1]:g} {unit}")
    added = []
    while len(added) < extend and all(p.meets for p in evaluated):
        qps = rounded(evaluated[-1].qps * ratio)
        evaluated.append(evaluate(qps, "grid"))
        added.append(qps)
    if added:
        notes.append(f"the grid extended above capacity.qps_max to {added[-1]:g} {unit}")
    return notes


def judged_point(qps: float, phase: str, table: Any, slo: SloConfig, wall_s: float) -> Point:
    """One rate's request table (simulated or real) judged: its percentiles, the goals' verdict
    at ``slo.percentile``, and its goodput by the same goals per request."""
    latency = latency_ms(table, METRICS)
    meets, missed = judge(latency, slo.goals(), slo.percentile)
    good = rate_of(table_goodput(table, slo.goodput_goals()))
    return Point(qps, phase, latency, meets, missed, wall_s, good)


def binding(answer: Answer) -> list[str]:
    """The goals the first rate above the answer missed: what limits the capacity."""
    above = [p for p in answer.points if not p.meets and (answer.qps is None or p.qps > answer.qps)]
    return list(above[0].violated) if above else []


def latency_agreement(simulated: Answer, real: Answer, keys: tuple[str, ...]) -> dict[str, Any]:
    """The goal percentiles (``keys``, e.g. ``ttft_p90``) of both searches at the rates both ran,
    as simulated / real − 1; summarized over the rates where the real engine met the goals (the
    curve below the knee, which decides the capacity). A capacity ratio far from 1 beside small
    errors here says the curve is flat near the goal: a few percent of latency move the rate a
    lot."""
    sim = {p.qps: p for p in simulated.points}
    truth_at = {p.qps: p for p in real.points}
    shared = sorted(q for q in truth_at if q in sim)
    met = [q for q in shared if truth_at[q].meets]
    errors: dict[str, list[float | None]] = {}
    summary: dict[str, dict[str, float | None]] = {}
    for key in keys:
        row: list[float | None] = []
        for qps in shared:
            truth = float(truth_at[qps].latency_ms[key])
            guess = float(sim[qps].latency_ms[key])
            ok = truth > 0 and np.isfinite(truth) and np.isfinite(guess)
            row.append(round(guess / truth - 1.0, 4) if ok else None)
        errors[key] = row
        below = np.array(
            [e for q, e in zip(shared, row, strict=True) if q in met and e is not None]
        )
        summary[key] = {
            "median_abs_error": round(float(np.median(np.abs(below))), 4) if len(below) else None,
            "mean_signed_error": round(float(below.mean()), 4) if len(below) else None,
        }
    return {"rates": shared, "met_rates": met, "errors": errors, "where_real_met": summary}
