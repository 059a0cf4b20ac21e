"""The fidelity stage's math: the load levels, the fidelity table, its largest absolute error
and noise floor, and the report (:mod:`.stage` runs the campaign).

Capacity rule (:mod:`gpu_simulate_test.core.metrics.capacity_probe`, shared with the capacity
stage): an all-at-once burst of requests of the fixed length mix is replayed for real; **capacity =
completed requests / (last completion − first arrival)**. An offered rate is **sustained** when
the queue does not grow over the run: the completion rate (over the span of completions) is at
least :data:`SUSTAINED_RATIO` of the arrival rate (over the span of arrivals).

A multi-turn workload's rate is sessions/s (its turns follow in a closed loop): its probe is a
burst of sessions without think time (``core.capacity_probe.session_capacity``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.capacity.contract import RATE_UNITS
from gpu_simulate_test.compare.clocks import ENGINE_COLUMNS
from gpu_simulate_test.core.metrics import percentiles as pct
from gpu_simulate_test.core.metrics import window

REQUEST_UNIT, SESSION_UNIT = RATE_UNITS
LOAD_FRACTIONS: tuple[float, ...] = (0.2, 0.5, 0.85)
"""Light, ~50% and ~85% of the measured capacity."""
GOAL_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e")
GOAL_STATS: tuple[str, ...] = pct.names((50, 90))
"""The fidelity table's percentiles, from the one list
(:data:`gpu_simulate_test.core.metrics.percentiles.PERCENTILES`)."""
SUSTAINED_RATIO = window.SUSTAINED_RATIO
CLOCKS: tuple[str, ...] = ("engine", "client")
"""The two clocks of a real run, in the report's order: the engine's own (what Vidur models:
``engine_*`` columns, backends that record it) and the client's (the front end included)."""
FIDELITY_COLUMNS: tuple[str, ...] = (
    "backend",
    "load_fraction",
    "offered_qps",
    "clock",
    "metric",
    "stat",
    "real_ms",
    "sim_ms",
    "rel_error",
    "abs_rel_error",
)


def rate_unit(capacity: Mapping[str, Any]) -> str:
    """The unit of a capacity record's ``capacity_qps`` and of its loads' offered rates:
    req/s, or sessions/s for a multi-turn workload (``core.capacity_probe.session_capacity``)."""
    return str(capacity.get("rate_unit", REQUEST_UNIT))


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
    """One row per backend, load, clock, metric and statistic from each load's percentiles
    (metric, stat, real_ms, sim_ms, and ``clock``: ``client`` where absent, as in compare's
    ``comparison_percentiles``); error = simulated / real − 1. The engine clock sorts first."""
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
                    "clock": str(rec.get("clock", "client")),
                    "metric": rec["metric"],
                    "stat": rec["stat"],
                    "real_ms": real,
                    "sim_ms": sim,
                    "rel_error": err,
                    "abs_rel_error": abs(err),
                }
            )
    table = pd.DataFrame(rows, columns=list(FIDELITY_COLUMNS))
    order = {name: i for i, name in enumerate((*metrics, *CLOCKS))}
    return table.sort_values(
        ["backend", "clock", "metric", "stat", "load_fraction"],
        key=lambda col: col.map(order) if col.name in ("metric", "clock") else col,
        kind="stable",
    ).reset_index(drop=True)


def real_percentiles(
    requests: pd.DataFrame,
    metrics: Sequence[str] = GOAL_METRICS,
    stats: Sequence[str] = GOAL_STATS,
    warmup_s: float = 0.0,
) -> dict[tuple[str, str, str], float]:
    """``(clock, metric, stat) → ms`` of one real run's ``ok`` requests after the warm-up (the
    one percentile routine, :func:`gpu_simulate_test.core.metrics.percentiles.describe`, as compare;
    NaN without any): the client's clock always, the engine's where the run recorded it."""
    measured = requests[window.in_window(requests, warmup_s)]
    out = {
        ("client", metric, stat): summary.stat(stat) * 1e3
        for metric, summary in pct.ok_request_summaries(measured, metrics).items()
        for stat in stats
    }
    ok = measured[measured["status"] == "ok"]
    for metric in metrics:
        column = ENGINE_COLUMNS.get(metric)
        if column is None or column not in ok.columns or not ok[column].notna().any():
            continue
        summary = pct.describe(pd.to_numeric(ok[column], errors="coerce").to_numpy(dtype=float))
        out.update({("engine", metric, stat): summary.stat(stat) * 1e3 for stat in stats})
    return out


def add_noise(
    table: pd.DataFrame,
    repeats: Mapping[tuple[str, float], Sequence[Mapping[tuple[str, str, str], float]]],
) -> pd.DataFrame:
    """The noise floor: per row, the real run repeated on the same workload (``real_repeat_ms``,
    the repeat furthest from the first) and ``noise`` = repeat / first − 1, on the row's clock.
    ``repeats`` maps (backend, load fraction) to each repeat's :func:`real_percentiles`; rows
    without are NaN."""
    out = table.copy()
    again, noise = [], []
    for rec in out.to_dict("records"):
        key = (rec.get("clock", "client"), rec["metric"], rec["stat"])
        runs = repeats.get((rec["backend"], rec["load_fraction"]), ())
        values = [r[key] for r in runs if key in r]
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


def add_at_level(
    table: pd.DataFrame, at_level: Mapping[tuple[str, float], Mapping[tuple[str, str, str], float]]
) -> pd.DataFrame:
    """Each row simulated again at its load's real run's own step level: ``sim_at_level_ms`` and
    ``rel_error_at_level`` (= that / real − 1); ``at_level`` maps (backend, load fraction) to
    (clock, metric, stat) → simulated ms. The table as it is when no load has a level."""
    if not at_level:
        return table
    out = table.copy()
    sims = []
    for rec in out.to_dict("records"):
        key = (str(rec.get("clock", "client")), str(rec["metric"]), str(rec["stat"]))
        sims.append(
            float(at_level.get((rec["backend"], rec["load_fraction"]), {}).get(key, np.nan))
        )
    out["sim_at_level_ms"] = sims
    real = out["real_ms"].astype(float)
    out["rel_error_at_level"] = np.where(real > 0, out["sim_at_level_ms"] / real - 1, np.nan)
    return out


def has_at_level(table: pd.DataFrame) -> bool:
    return "rel_error_at_level" in table.columns and bool(
        np.isfinite(table["rel_error_at_level"].astype(float)).any()
    )


def has_noise(table: pd.DataFrame) -> bool:
    return "noise" in table.columns and bool(np.isfinite(table["noise"].astype(float)).any())


def largest_abs_error(table: pd.DataFrame) -> dict[str, Any]:
    """The largest |simulated / real − 1| in percent over the finite rows, and where it is (its
    ``clock`` where the table has one); ``abs_error_pct`` is None when no row is finite."""
    finite = table[np.isfinite(table["abs_rel_error"].astype(float))]
    if finite.empty:
        return {"abs_error_pct": None}
    rec = finite.iloc[int(np.argmax(finite["abs_rel_error"].to_numpy(dtype=float)))]
    worst = {
        "abs_error_pct": round(float(rec["abs_rel_error"]) * 100, 2),
        "backend": str(rec["backend"]),
        "metric": str(rec["metric"]),
        "stat": str(rec["stat"]),
        "load_fraction": float(rec["load_fraction"]),
    }
    if "clock" in finite.columns:  # which clock the row is on (client, engine)
        worst["clock"] = str(rec["clock"])
    return worst


def error_spread(table: pd.DataFrame, column: str = "abs_rel_error") -> dict[str, Any]:
    """Over the finite rows: how many, the median absolute error (percent), how many are within
    5% and 10% (the goal, and twice it), and the mean signed error (percent: the bias; of
    ``rel_error`` for the simulation's spread, of ``noise`` itself for the truth's); the median is
    NaN without any (stored as null), the mean None without a signed column."""
    errors = np.abs(table[column].astype(float).to_numpy())
    errors = errors[np.isfinite(errors)]
    signed_column = "rel_error" if column == "abs_rel_error" else column
    mean_signed = None
    if signed_column in table.columns:
        signed = table[signed_column].astype(float).to_numpy()
        signed = signed[np.isfinite(signed)]
        mean_signed = round(float(signed.mean()) * 100, 2) if signed.size else None
    return {
        "rows": int(errors.size),
        "median_abs_error_pct": round(pct.describe(errors).median * 100, 2),
        "within_5pct": int((errors <= 0.05).sum()),
        "within_10pct": int((errors <= 0.10).sum()),
        "mean_signed_error_pct": mean_signed,
    }


def headline(table: pd.DataFrame) -> pd.DataFrame:
    """The rows a campaign is judged on, per backend: the engine clock's where the backend has a
    finite one (what Vidur models), else the client's."""
    if "clock" not in table.columns or table.empty:
        return table
    keep = []
    for _, part in table.groupby("backend", sort=False):
        engine = part[part["clock"] == "engine"]
        finite = np.isfinite(engine["abs_rel_error"].astype(float)).any()
        keep.append(engine if finite else part[part["clock"] != "engine"])
    return pd.concat(keep)


def clock_of(table: pd.DataFrame) -> dict[str, str]:
    """Per backend, the clock :func:`headline` judges it on."""
    rows = headline(table)
    if "clock" not in rows.columns:
        return {}
    return {str(b): str(part["clock"].iloc[0]) for b, part in rows.groupby("backend", sort=False)}


def _by_clock(table: pd.DataFrame, column: str = "abs_rel_error") -> dict[str, Any]:
    """Per backend and clock: the largest error and the spread (or the noise floor's)."""
    out: dict[str, Any] = {}
    for (backend, clock), part in table.groupby(["backend", "clock"], sort=False):
        if column == "noise":
            out.setdefault(str(backend), {})[str(clock)] = error_spread(part, "noise")
        else:
            out.setdefault(str(backend), {})[str(clock)] = {
                "largest": largest_abs_error(part),
                "spread": error_spread(part),
            }
    return out


def fidelity_json(
    name: str,
    setup: Mapping[str, Any],
    capacity: Mapping[str, Mapping[str, Any]],
    table: pd.DataFrame,
) -> dict[str, Any]:
    """``fidelity.json``: setup, capacity per backend, every row, the largest error overall and
    per backend (percent) on each backend's headline clock, and every clock's apart."""
    rows = [
        {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in rec.items()}
        for rec in table.to_dict("records")
    ]
    judged = headline(table)
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
        "clock_convention": (
            "engine: the engine's own clock per request (what Vidur models); client: as the "
            "client saw it (the front end included); the headline figures are on the engine "
            "clock where the backend recorded it (headline_clock)"
        ),
        "headline_clock": clock_of(table),
        "largest_abs_error": largest_abs_error(judged),
        "largest_abs_error_by_backend": {
            str(b): largest_abs_error(t) for b, t in judged.groupby("backend", sort=False)
        },
        "error_spread_by_backend": {
            str(b): error_spread(t) for b, t in judged.groupby("backend", sort=False)
        },
        "by_clock": _by_clock(table),
        **(
            {
                "noise_convention": "noise = real repeat / real - 1 (same workload, run again)",
                "noise_spread_by_backend": {
                    str(b): error_spread(t, "noise")
                    for b, t in judged.groupby("backend", sort=False)
                },
                "noise_spread_by_clock": _by_clock(table, "noise"),
            }
            if has_noise(table)
            else {}
        ),
    }


def step_attribution(
    totals: Mapping[str, Any], host_memory: Mapping[str, Any] | None = None
) -> dict[str, float | None]:
    """A load's step-level attribution (``comparison.json`` ``steps.totals`` of its compare run):
    step time vs scheduling vs the front end; with its ``host_memory``, the truth's host
    reading over the calibration's. The front end is the mean TTFT at the client less the
    mean on the engine's own clock, on each side (one span, both sides); from a comparison
    before those means, the client less the server's own TTFT metric against the calibrated
    front end, as it was reported then."""

    def num(value: Any) -> float | None:
        return float(value) if isinstance(value, int | float) and np.isfinite(value) else None

    ttft = totals.get("ttft_ms") or {}
    client, engine = num(ttft.get("client")), num(ttft.get("engine"))
    sim, sim_engine = num(ttft.get("sim")), num(ttft.get("sim_engine"))
    if engine is None or sim_engine is None:  # a comparison from before the engine-clock means
        engine, sim, sim_engine = num(ttft.get("server")), num(ttft.get("sim_frontend")), 0.0
    return {
        "step_time_error": num(totals.get("step_time_error")),
        "step_count_error": num(totals.get("step_count_error")),
        "busy_time_error": num(totals.get("busy_time_error")),
        "real_frontend_ms": client - engine if client is not None and engine is not None else None,
        "sim_frontend_ms": sim - sim_engine if sim is not None and sim_engine is not None else None,
        "host_memory_ratio": num(((host_memory or {}).get("real") or {}).get("ratio")),
    }
