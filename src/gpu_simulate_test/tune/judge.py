"""The tune's answers judged against the real grids (``tune.verify=grid``: every configuration's
capacity measured on a server of its own), by the tune benchmark's rules: simulated within ±15%
of the grids' mean or within their spread (:func:`verdict`), Spearman against the mean, the
measured best in the simulated top 2 (:func:`judge`).

:func:`analyse` judges several fresh calibrations (``tune.verify=false`` runs made back to back on
fresh bundles) that way: each alone (what a tune with ``tune.calibrations=1`` would have
answered), the median one (by the geometric mean of its capacities: the tune's choice with
``tune.calibrations=K``, :mod:`.calibrations`) and the median per configuration (not what the
tune answers: a bound on what pooling could give); :func:`render` is its table.
``benchmarks/capacity_tune/bench_tune.py`` and ``calibration_ensemble.py`` print them.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pandas as pd

from gpu_simulate_test.tune.calibrations import median_index
from gpu_simulate_test.tune.rank import spearman

WITHIN = 0.15
"""Issue 47's bound on a simulated capacity against the measured one (or the measured spread
where that is wider)."""


def verdict(
    simulated: float | None, mean: float | None, spread: float
) -> tuple[float | None, bool]:
    """The simulated capacity's error against the measured mean (None without both), and
    whether it is within ±:data:`WITHIN` or within the measured spread where that is wider."""
    error = simulated / mean - 1 if simulated and mean else None
    return error, error is not None and abs(error) <= max(WITHIN, spread)


def simulated(run: Path) -> dict[str, float]:
    """A ``tune.verify=false`` run's capacity per configuration (``tune.csv``; none left out)."""
    path = run / "tune.csv"
    if not path.is_file():
        raise SystemExit(f"calibration_ensemble: {path}: no tune.csv (a tune run expected)")
    frame = pd.read_csv(path)
    frame = frame[frame["capacity_qps"].notna()]
    return {
        str(c): float(q) for c, q in zip(frame["config_id"], frame["capacity_qps"], strict=True)
    }


def measured(runs: list[Path]) -> dict[str, list[float]]:
    """Each configuration's measured capacity, one per grid (``verify.configs``)."""
    out: dict[str, list[float]] = {}
    for run in runs:
        doc = json.loads((run / "tune.json").read_text())
        verify = doc.get("verify") or {}
        if verify.get("mode") != "grid":
            raise SystemExit(f"calibration_ensemble: {run}/tune.json: not a tune.verify=grid run")
        for row in verify["configs"]:
            if row["measured_qps"] is not None:
                out.setdefault(row["config_id"], []).append(float(row["measured_qps"]))
    return out


def judge(answer: dict[str, float], truth: dict[str, list[float]]) -> dict[str, Any]:
    """One answer (capacity per configuration) against the grids."""
    rows = {}
    for config, values in truth.items():
        mean = statistics.fmean(values)
        spread = max(values) / min(values) - 1 if len(values) > 1 else 0.0
        sim = answer.get(config)
        error, ok = verdict(sim, mean, spread)
        rows[config] = {"simulated": sim, "error": error, "ok": ok}
    common = [c for c in truth if answer.get(c)]
    rho = spearman([answer[c] for c in common], [statistics.fmean(truth[c]) for c in common])
    top2 = sorted(common, key=lambda c: -answer[c])[:2]
    best = max(truth, key=lambda c: statistics.fmean(truth[c]))
    errors = [r["error"] for r in rows.values() if r["error"] is not None]
    return {
        "configs": rows,
        "within": sum(1 for r in rows.values() if r["ok"]),
        "of": len(rows),
        "mean_error": statistics.fmean(errors) if errors else None,
        "spearman": rho,
        "best_in_top2": best in top2,
    }


def analyse(cals: list[Path], grids: list[Path]) -> dict[str, Any]:
    answers = {run.name: simulated(run) for run in cals}
    truth = measured(grids)
    common = [c for c in truth if all(c in a for a in answers.values())]
    names = list(answers)
    levels = [statistics.geometric_mean([answers[name][c] for c in common]) for name in names]
    chosen = names[median_index(levels)]
    per_config = {c: statistics.median([answers[n][c] for n in names]) for c in common}
    return {
        "calibrations": [str(p) for p in cals],
        "grids": [str(p) for p in grids],
        "measured": truth,
        "levels": dict(zip(names, levels, strict=True)),
        "each": {name: judge(answers[name], truth) for name in names},
        "median_calibration": {"name": chosen, **judge(answers[chosen], truth)},
        "median_per_configuration": judge(per_config, truth),
    }


def render(result: dict[str, Any]) -> str:
    names = list(result["each"])
    chosen = result["median_calibration"]["name"]
    header = ["configuration", "measured (grids)", *names, "median per configuration"]
    lines = ["| " + " | ".join(header) + " |", "| --- " * len(header) + "|"]

    def cell(judged: dict[str, Any], config: str) -> str:
        row = judged["configs"][config]
        if row["simulated"] is None:
            return "–"
        mark = "" if row["ok"] else " **✗**"
        return f"{row['simulated']:.4g} ({100 * row['error']:+.1f}%){mark}"

    for config, values in result["measured"].items():
        cells = [cell(result["each"][n], config) for n in names]
        cells.append(cell(result["median_per_configuration"], config))
        shown = " / ".join(f"{v:.4g}" for v in values)
        lines.append(f"| {config} | {shown} | " + " | ".join(cells) + " |")
    judged = [result["each"][n] for n in names] + [result["median_per_configuration"]]
    for label, key, fmt in (
        ("within ±15% or the spread", "within", "{}"),
        ("mean signed error", "mean_error", "{:+.1%}"),
        ("Spearman", "spearman", "{:.3f}"),
        ("measured best in simulated top 2", "best_in_top2", "{}"),
    ):
        values = [fmt.format(j[key]) if j[key] is not None else "–" for j in judged]
        if key == "within":
            values = [f"{j['within']} of {j['of']}" for j in judged]
        lines.append(f"| {label} | | " + " | ".join(values) + " |")
    levels = ", ".join(f"{n} {v:.4g}" for n, v in result["levels"].items())
    lines += [
        "",
        f"Levels (geometric mean capacity, req/s): {levels}; the median calibration, the "
        f"tune's answer with `tune.calibrations={len(names)}`: **{chosen}**.",
    ]
    return "\n".join(lines)
