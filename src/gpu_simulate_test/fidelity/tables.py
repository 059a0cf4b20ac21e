"""The fidelity stage's math: capacity from a burst probe, the load levels, the fidelity table,
its largest absolute error and noise floor, and the report (:mod:`.stage` runs the campaign).

Capacity rule: an all-at-once burst of requests of the fixed length mix is replayed for real;
**capacity = completed requests / (last completion − first arrival)**, the engine's completion
rate when its queue never runs dry. An offered rate is **sustained** when the queue does not grow
over the run: the completion rate (over the span of completions) is at least
:data:`SUSTAINED_RATIO` of the arrival rate (over the span of arrivals).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpu_simulate_test.core import percentiles as pct

LOAD_FRACTIONS: tuple[float, ...] = (0.2, 0.5, 0.85)
"""Light, ~50% and ~85% of the measured capacity."""
GOAL_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e")
GOAL_STATS: tuple[str, ...] = pct.names((50, 90))
"""The fidelity table's percentiles, from the one list
(:data:`gpu_simulate_test.core.percentiles.PERCENTILES`)."""
SUSTAINED_RATIO = 0.9
"""Completion rate / arrival rate at or above this: the queue did not grow (allowing for the
spread of request lengths at the ends of a short run)."""
FIDELITY_COLUMNS: tuple[str, ...] = (
    "backend",
    "load_fraction",
    "offered_qps",
    "metric",
    "stat",
    "real_ms",
    "sim_ms",
    "rel_error",
    "abs_rel_error",
)


def _finish_times(
    arrival_time_s: npt.ArrayLike, e2e_s: npt.ArrayLike, ok: npt.ArrayLike
) -> tuple[np.ndarray, np.ndarray]:
    arrival = np.asarray(arrival_time_s, dtype=float)
    finish = arrival + np.asarray(e2e_s, dtype=float)
    keep = np.asarray(ok, dtype=bool) & np.isfinite(finish)
    return arrival, finish[keep]


def burst_capacity(arrival_time_s: npt.ArrayLike, e2e_s: npt.ArrayLike, ok: npt.ArrayLike) -> float:
    """Requests/s the engine completes with a full queue: ok requests / (last finish − first
    arrival) of an all-at-once burst. Raises ValueError when nothing completed."""
    arrival, finish = _finish_times(arrival_time_s, e2e_s, ok)
    if finish.size == 0:
        raise ValueError("capacity probe: no request completed")
    span = float(finish.max() - arrival.min())
    if span <= 0:
        raise ValueError(f"capacity probe: non-positive span {span} s")
    return finish.size / span


def completion_ratio(
    arrival_time_s: npt.ArrayLike, e2e_s: npt.ArrayLike, ok: npt.ArrayLike
) -> float:
    """Completion rate / arrival rate of one run, each over its own span (1.0: the engine kept
    up; well below 1: requests finished more slowly than they came, the queue grew).
    NaN with fewer than two completions."""
    arrival, finish = _finish_times(arrival_time_s, e2e_s, ok)
    if finish.size < 2 or arrival.size < 2:
        return float("nan")
    arrival_rate = (arrival.size - 1) / max(float(arrival.max() - arrival.min()), 1e-9)
    completion_rate = (finish.size - 1) / max(float(finish.max() - finish.min()), 1e-9)
    return completion_rate / arrival_rate


def is_sustained(ratio: float, threshold: float = SUSTAINED_RATIO) -> bool:
    """The capacity rule's test of one offered rate (see the module docstring)."""
    return bool(np.isfinite(ratio) and ratio >= threshold)


def load_levels(
    capacity_qps: float, fractions: Sequence[float] = LOAD_FRACTIONS
) -> list[tuple[float, float]]:
    """(fraction, offered requests/s) per load level, rates rounded to 4 significant digits."""
    if not np.isfinite(capacity_qps) or capacity_qps <= 0:
        raise ValueError(f"capacity must be a positive rate, got {capacity_qps}")
    out = []
    for fraction in fractions:
        if not 0 < fraction <= 1:
            raise ValueError(f"load fraction {fraction} is not in (0, 1]")
        out.append((float(fraction), float(f"{capacity_qps * fraction:.4g}")))
    return out


def fidelity_rows(
    levels: Sequence[tuple[str, float, float, pd.DataFrame]],
    metrics: Sequence[str] = GOAL_METRICS,
    stats: Sequence[str] = GOAL_STATS,
) -> pd.DataFrame:
    """One row per backend, load, metric and statistic from each load's compare percentiles
    (``comparison_percentiles``: metric, stat, real_ms, sim_ms); error = simulated / real − 1."""
    rows = []
    for backend, fraction, qps, percentiles in levels:
        keep = percentiles["metric"].isin(metrics) & percentiles["stat"].isin(stats)
        for rec in percentiles[keep].to_dict("records"):
            real, sim = float(rec["real_ms"]), float(rec["sim_ms"])
            err = sim / real - 1 if np.isfinite(real) and real > 0 else float("nan")
            rows.append(
                {
                    "backend": backend,
                    "load_fraction": fraction,
                    "offered_qps": qps,
                    "metric": rec["metric"],
                    "stat": rec["stat"],
                    "real_ms": real,
                    "sim_ms": sim,
                    "rel_error": err,
                    "abs_rel_error": abs(err),
                }
            )
    table = pd.DataFrame(rows, columns=list(FIDELITY_COLUMNS))
    order = {name: i for i, name in enumerate(metrics)}
    return table.sort_values(
        ["backend", "metric", "stat", "load_fraction"],
        key=lambda col: col.map(order) if col.name == "metric" else col,
        kind="stable",
    ).reset_index(drop=True)


def real_percentiles(
    requests: pd.DataFrame,
    metrics: Sequence[str] = GOAL_METRICS,
    stats: Sequence[str] = GOAL_STATS,
) -> dict[tuple[str, str], float]:
    """``(metric, stat) → ms`` of one real run's ``ok`` requests (the one percentile routine,
    :func:`gpu_simulate_test.core.percentiles.describe`, as compare; NaN without any)."""
    return {
        (metric, stat): summary.stat(stat) * 1e3
        for metric, summary in pct.ok_request_summaries(requests, metrics).items()
        for stat in stats
    }


def add_noise(
    table: pd.DataFrame,
    repeats: Mapping[tuple[str, float], Sequence[Mapping[tuple[str, str], float]]],
) -> pd.DataFrame:
    """The noise floor: per row, the real run repeated on the same workload (``real_repeat_ms``,
    the repeat furthest from the first) and ``noise`` = repeat / first − 1. ``repeats`` maps
    (backend, load fraction) to each repeat's :func:`real_percentiles`; rows without are NaN."""
    out = table.copy()
    again, noise = [], []
    for rec in out.to_dict("records"):
        values = [
            r[(rec["metric"], rec["stat"])]
            for r in repeats.get((rec["backend"], rec["load_fraction"]), ())
            if (rec["metric"], rec["stat"]) in r
        ]
        errors = [v / rec["real_ms"] - 1 if rec["real_ms"] > 0 else float("nan") for v in values]
        if not errors:
            again.append(float("nan"))
            noise.append(float("nan"))
            continue
        worst = int(np.nanargmax(np.abs(errors))) if np.isfinite(errors).any() else 0
        again.append(float(values[worst]))
        noise.append(float(errors[worst]))
    out["real_repeat_ms"] = again
    out["noise"] = noise
    return out


def has_noise(table: pd.DataFrame) -> bool:
    return "noise" in table.columns and bool(np.isfinite(table["noise"].astype(float)).any())


def largest_abs_error(table: pd.DataFrame) -> dict[str, Any]:
    """The largest |simulated / real − 1| in percent over the finite rows, and where it is;
    ``abs_error_pct`` is None when no row is finite."""
    finite = table[np.isfinite(table["abs_rel_error"].astype(float))]
    if finite.empty:
        return {"abs_error_pct": None}
    rec = finite.iloc[int(np.argmax(finite["abs_rel_error"].to_numpy(dtype=float)))]
    return {
        "abs_error_pct": round(float(rec["abs_rel_error"]) * 100, 2),
        "backend": str(rec["backend"]),
        "metric": str(rec["metric"]),
        "stat": str(rec["stat"]),
        "load_fraction": float(rec["load_fraction"]),
    }


def error_spread(table: pd.DataFrame, column: str = "abs_rel_error") -> dict[str, Any]:
    """Over the finite rows: how many, the median absolute error (percent), and how many are
    within 5% and 10% (the goal, and twice it); the median is NaN without any (stored as null)."""
    errors = np.abs(table[column].astype(float).to_numpy())
    errors = errors[np.isfinite(errors)]
    return {
        "rows": int(errors.size),
        "median_abs_error_pct": round(pct.describe(errors).median * 100, 2),
        "within_5pct": int((errors <= 0.05).sum()),
        "within_10pct": int((errors <= 0.10).sum()),
    }


def summary_table(reports: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table over several ``<name>-fidelity.json`` reports: per report and backend,
    requests per load, largest, median, rows within 5% / 10% (computed from the rows), and the
    real-vs-real noise floor where the report has one."""
    lines = [
        "| report | requests per load | backend | largest abs error | median | ≤5% | ≤10% "
        "| real vs real: largest / median |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for report in reports:
        table = pd.DataFrame(report["rows"])
        table["abs_rel_error"] = table["abs_rel_error"].astype(float)
        for backend, part in table.groupby("backend", sort=False):
            worst = largest_abs_error(part)["abs_error_pct"]
            spread = error_spread(part)
            floor = "–"
            if has_noise(part):
                noise = error_spread(part, "noise")
                largest = float(np.nanmax(np.abs(part["noise"].astype(float)))) * 100
                floor = f"{largest:.1f}% / {noise['median_abs_error_pct']:.1f}%"
            lines.append(
                f"| {report['name']} | {report.get('requests_per_load', '')} | {backend} | "
                f"{worst:.1f}% | {spread['median_abs_error_pct']:.1f}% | "
                f"{spread['within_5pct']}/{spread['rows']} | "
                f"{spread['within_10pct']}/{spread['rows']} | {floor} |"
            )
    return "\n".join(lines)


def fidelity_json(
    name: str,
    setup: Mapping[str, Any],
    capacity: Mapping[str, Mapping[str, Any]],
    table: pd.DataFrame,
) -> dict[str, Any]:
    """``fidelity.json``: setup, capacity per backend, every row, the largest error overall and
    per backend (percent)."""
    rows = [
        {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in rec.items()}
        for rec in table.to_dict("records")
    ]
    return {
        "name": name,
        **setup,
        "error_convention": "rel_error = simulated / real - 1; abs_rel_error = |rel_error|",
        "capacity_rule": (
            "capacity = completed requests / (last completion - first arrival) of an "
            f"all-at-once burst; a load is sustained when completion rate / arrival rate >= "
            f"{SUSTAINED_RATIO}"
        ),
        "capacity": {k: dict(v) for k, v in capacity.items()},
        "rows": rows,
        "largest_abs_error": largest_abs_error(table),
        "largest_abs_error_by_backend": {
            str(b): largest_abs_error(t) for b, t in table.groupby("backend", sort=False)
        },
        "error_spread_by_backend": {
            str(b): error_spread(t) for b, t in table.groupby("backend", sort=False)
        },
        **(
            {
                "noise_convention": "noise = real repeat / real - 1 (same workload, run again)",
                "noise_spread_by_backend": {
                    str(b): error_spread(t, "noise")
                    for b, t in table.groupby("backend", sort=False)
                },
            }
            if has_noise(table)
            else {}
        ),
    }


def _pct(value: float) -> str:
    return f"{value:+.1%}" if np.isfinite(value) else "–"


def step_attribution(totals: Mapping[str, Any]) -> dict[str, float | None]:
    """A load's step-level attribution (``comparison.json`` ``steps.totals`` of its compare run):
    step time vs scheduling vs the front end."""

    def num(value: Any) -> float | None:
        return float(value) if isinstance(value, int | float) and np.isfinite(value) else None

    ttft = totals.get("ttft_ms") or {}
    client, server = num(ttft.get("client")), num(ttft.get("server"))
    return {
        "step_time_error": num(totals.get("step_time_error")),
        "step_count_error": num(totals.get("step_count_error")),
        "busy_time_error": num(totals.get("busy_time_error")),
        "real_frontend_ms": client - server if client is not None and server is not None else None,
        "sim_frontend_ms": num(ttft.get("sim_frontend")),
    }


def where_error_lives(capacity: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The report's ``Where the error lives`` section: per load, the engine steps' attribution
    (loads whose compare run had a real step log); empty without any."""
    rows = [
        (backend, level)
        for backend, cap in capacity.items()
        for level in cap["loads"]
        if level.get("steps")
    ]
    if not rows:
        return []

    def pct(v: float | None) -> str:
        return "–" if v is None else f"{v:+.1%}"

    def ms(v: float | None) -> str:
        return "–" if v is None else f"{v:.1f}"

    lines = [
        "",
        "## Where the error lives",
        "",
        "From each load's engine-step comparison (compare's `steps.csv`): *step time* is how much "
        "faster or slower Vidur's steps are than the engine's for the same compositions (engine "
        "loop included); *steps* and *busy time* compare the step count and the total time the "
        "engine was busy (scheduling shows in the count); *front end* is the mean TTFT the "
        "client saw beyond the server's own TTFT, against what the simulation adds for it.",
        "",
        "| backend | load | step time | steps | busy time | front end real (ms) | "
        "front end simulated (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, level in rows:
        a = level["steps"]
        lines.append(
            f"| {backend} | {level['load_fraction']:.0%} | {pct(a['step_time_error'])} | "
            f"{pct(a['step_count_error'])} | {pct(a['busy_time_error'])} | "
            f"{ms(a['real_frontend_ms'])} | {ms(a['sim_frontend_ms'])} |"
        )
    return lines


def disturbance_lines(real_runs: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """The report's account of the real runs: which were disturbed (late sends, held-back
    streams, foreign CPU) and what was done; ``None``: a real phase that did not check."""
    lines = ["", "## Real runs", ""]
    if real_runs is None:
        return [*lines, "Not checked for disturbance (a real phase older than the check)."]
    marked = [run for run in real_runs if run["disturbed"] or run["reruns"]]
    if not marked:
        signs = "late sends, held-back streams, foreign CPU"
        return [*lines, f"All {len(real_runs)} real runs undisturbed ({signs})."]
    lines += ["| backend | load | run | attempts | verdict |", "| --- | --- | --- | --- | --- |"]
    for run in marked:
        lines.append(
            f"| {run['backend']} | {run['load_fraction']:.0%} | {run['run']} | "
            f"{run['reruns'] + 1} | {run['verdict']} |"
        )
    return lines


def markdown(
    name: str,
    setup: Mapping[str, Any],
    capacity: Mapping[str, Mapping[str, Any]],
    table: pd.DataFrame,
    plots: Mapping[str, str],
) -> str:
    """``report.md``: setup, capacity, the table (metric × percentile × load) and the largest
    absolute error; a partial report says so first."""
    lines = [f"# Fidelity: {name}", ""]
    if setup.get("partial"):
        lines += [
            "**Partial report**: " + "; ".join(setup.get("notes") or ["see the loads"]) + ".",
            "",
        ]
    lines += [
        f"- {key}: {value}"
        for key, value in setup.items()
        if not isinstance(value, dict | list) and key not in ("partial", "schema_version")
    ]
    for key, value in setup.items():
        if isinstance(value, dict):
            lines.append(f"- {key}: " + ", ".join(f"{k} {v}" for k, v in value.items()))
    lines += [
        "",
        "Error = simulated / real − 1 (negative: the simulator predicts too fast). TTFT includes "
        "queueing; TPOT = (E2E − TTFT) / (output − 1).",
        "",
        "## Capacity",
        "",
        "| backend | probe requests | capacity (req/s) | output tok/s |",
        "| --- | --- | --- | --- |",
    ]
    for backend, cap in capacity.items():
        tokens = cap.get("output_tokens_per_s")
        probe = cap["probe_requests"] or "none (capacity given)"
        lines.append(
            f"| {backend} | {probe} | {cap['capacity_qps']:.4g} | "
            f"{'–' if tokens is None else f'{tokens:.1f}'} |"
        )
    lines += ["", "## Loads", "", "| backend | load | offered (req/s) | completion / arrival |"]
    lines += ["| --- | --- | --- | --- |"]
    for backend, cap in capacity.items():
        for level in cap["loads"]:
            flag = "" if level["sustained"] else " (queue grew)"
            lines.append(
                f"| {backend} | {level['load_fraction']:.0%} | {level['offered_qps']:.4g} | "
                f"{level['completion_ratio']:.2f}{flag} |"
            )
    lines += disturbance_lines(setup.get("real_runs"))
    noisy = has_noise(table)
    lines += ["", "## Table (ms)", ""]
    if noisy:
        lines += [
            "The real run was repeated on the same workload: *real again* is the repeat "
            "furthest from the first run, *real vs real* = again / real − 1, the noise floor "
            "of the truth.",
            "",
            "| backend | metric | stat | load | real | simulated | error | real again "
            "| real vs real |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        ]
    else:
        lines += ["| backend | metric | stat | load | real | simulated | error |"]
        lines += ["| --- | --- | --- | --- | --- | --- | --- |"]
    for rec in table.to_dict("records"):
        row = (
            f"| {rec['backend']} | {rec['metric']} | {rec['stat']} | {rec['load_fraction']:.0%} "
            f"| {rec['real_ms']:.2f} | {rec['sim_ms']:.2f} | {_pct(rec['rel_error'])} |"
        )
        if noisy:
            row += f" {rec['real_repeat_ms']:.2f} | {_pct(rec['noise'])} |"
        lines.append(row)
    lines += where_error_lives(capacity)
    worst = largest_abs_error(table)
    lines += ["", "## Largest absolute error", ""]
    if worst["abs_error_pct"] is None:
        lines.append("none (no finite row)")
    else:
        lines.append(
            f"**{worst['abs_error_pct']:.1f}%** overall ({worst['backend']}, {worst['metric']} "
            f"{worst['stat']} at {worst['load_fraction']:.0%} of capacity)."
        )
    for name_, part in table.groupby("backend", sort=False):
        w = largest_abs_error(part)
        if w["abs_error_pct"] is not None:
            spread = error_spread(part)
            lines.append(
                f"- {name_}: {w['abs_error_pct']:.1f}% ({w['metric']} {w['stat']} at "
                f"{w['load_fraction']:.0%}); median {spread['median_abs_error_pct']:.1f}%, "
                f"{spread['within_5pct']} of {spread['rows']} rows within 5%, "
                f"{spread['within_10pct']} within 10%"
            )
            if noisy:
                floor = error_spread(part, "noise")
                lines.append(
                    f"  - real vs real (noise floor): largest "
                    f"{np.nanmax(np.abs(part['noise'].astype(float))):.1%}, median "
                    f"{floor['median_abs_error_pct']:.1f}%, {floor['within_5pct']} of "
                    f"{floor['rows']} rows within 5%"
                )
    lines.append("")
    lines += [f"![{backend} latency vs load]({path})" for backend, path in plots.items()]
    lines.append("")
    return "\n".join(lines)
