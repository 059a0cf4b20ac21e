"""The main job's client TTFT over many stored batches: what a batch of five can tell apart.

Issue 64 asks of five fresh main jobs that the client TTFT p50 and p90 each land within
max(10%, real vs real) in 4 of 5 and that their mean signed error stays within ±5%. On this host
a fresh server runs 0.84–1.30× its calibration's step time, and near the tail the client TTFT
moves about one for one with it, so one batch's mean drifts with the host. This reads batches
that ``bench_fresh_profiles --out`` stored (each FILE one batch) and prints, per batch and pooled:

- per batch: its runs, their mean step level (each real run's busy steps over the model's, the
  pipeline's ``pipeline.at_level``), and per figure the runs within and the mean signed error;
- pooled: each figure's mean signed error, its spread over runs (SD) and the mean's standard
  error; the spread a batch of five's mean has (SD / sqrt(5)) and how often a batch of five would
  land within ±5% were the pooled mean the model's (a normal reading);
- the error against the step level, a line fitted over every run: the error at level 1 (the
  calibration's own speed: the model's error apart from the host's) with its standard error,
  and the slope (how much of the host's speed reaches the figure); beside it the mean of the
  runs simulated again at their own level (``at_level``).

Batches made by different commits mix models: name them with ``LABEL=FILE`` and read the
pooled figures over the batches of one model apart (``--only LABEL ...``).

Run: ``python -m benchmarks.fidelity.bench_main_job_pool [LABEL=]FILE [...] [--only LABEL ...]
[--out F.json]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.fidelity.bench_fresh_profiles import fmt as pct
from benchmarks.fidelity.bench_fresh_profiles import judged
from gpu_simulate_test.fidelity.bounds import LIMIT

FIGURES = ("client_p50", "client_p90")
"""The figures issue 64's main-job target judges (``results[*].ttft``'s keys)."""
BATCH = 5
"""Runs in one of the target's batches."""
MEAN_LIMIT = 0.05
"""The target's bound on a batch's mean signed error."""


def read_batches(specs: list[str]) -> list[tuple[str, list[dict[str, Any]]]]:
    """Each ``[LABEL=]FILE``'s runs (its ``results``), labelled by LABEL or the file's stem."""
    out = []
    for spec in specs:
        label, _, name = spec.rpartition("=")
        path = Path(name)
        try:
            runs = json.loads(path.read_text())["results"]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise SystemExit(f"{path}: not a bench_fresh_profiles --out file ({err})") from err
        out.append((label or path.stem, [r for r in runs if isinstance(r, dict)]))
    return out


def line_at_one(level: np.ndarray, error: np.ndarray) -> dict[str, float]:
    """The least-squares line of ``error`` on ``level``: its value at level 1 with that value's
    standard error, and its slope (NaN with fewer than three runs or no spread in level)."""
    n = len(level)
    if n < 3 or np.ptp(level) == 0:
        return {"at_one": math.nan, "at_one_se": math.nan, "slope": math.nan}
    slope, intercept = np.polyfit(level, error, 1)
    residual = error - (slope * level + intercept)
    s2 = float(np.sum(residual**2)) / (n - 2)
    centred = level - level.mean()
    var_at_one = s2 * (1.0 / n + (1.0 - level.mean()) ** 2 / float(np.sum(centred**2)))
    return {
        "at_one": float(slope + intercept),
        "at_one_se": math.sqrt(var_at_one),
        "slope": float(slope),
    }


def within_chance(mean: float, sd: float, limit: float = MEAN_LIMIT, batch: int = BATCH) -> float:
    """How often a batch's mean of ``batch`` runs lands within ±``limit`` when runs spread as
    a normal of this ``mean`` and ``sd``."""
    if not sd > 0:
        return float(abs(mean) <= limit)
    scale = sd / math.sqrt(batch)

    def cdf(x: float) -> float:
        return 0.5 * (1.0 + math.erf((x - mean) / (scale * math.sqrt(2.0))))

    return cdf(limit) - cdf(-limit)


def at_least(p: float, k: int = BATCH - 1, n: int = BATCH) -> float:
    """How often at least ``k`` of ``n`` runs land within, each with chance ``p``."""
    return sum(math.comb(n, j) * p**j * (1.0 - p) ** (n - j) for j in range(k, n + 1))


def pooled(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure over these runs: mean signed error, SD, the mean's standard error, a batch of
    five's spread and chance within ±5%, the runs within max(10%, real vs real) and the chance
    of 4 of 5 at that rate, the line on the step level and the at-level mean."""
    out: dict[str, Any] = {"runs": len(runs)}
    for figure in FIGURES:
        rows = [(r.get("step_level"), (r.get("ttft") or {}).get(figure) or {}) for r in runs]
        errors = np.array([f["error"] for _, f in rows if f.get("error") is not None], float)
        if not len(errors):
            continue
        sd = float(np.std(errors, ddof=1)) if len(errors) > 1 else math.nan
        leveled = [(lv, f["error"]) for lv, f in rows if lv and f.get("error") is not None]
        at_level = [f["at_level"] for _, f in rows if f.get("at_level") is not None]
        within, judged_runs, _ = judged([f for _, f in rows])
        repeat = np.array(
            [f["real_vs_real"] for _, f in rows if f.get("real_vs_real") is not None], float
        )
        out[figure] = {
            "within": within,
            "judged": judged_runs,
            "four_of_five_chance": at_least(within / judged_runs),
            # like with like: the simulation and the truth's own repeat, each within 10% strictly
            "strictly_within": int(np.sum(np.abs(errors) <= LIMIT)),
            "repeat_within": int(np.sum(np.abs(repeat) <= LIMIT)),
            "repeats": len(repeat),
            "repeat_sd": float(np.std(repeat, ddof=1)) if len(repeat) > 1 else math.nan,
            "mean": float(errors.mean()),
            "sd": sd,
            "se": sd / math.sqrt(len(errors)),
            "batch_sd": sd / math.sqrt(BATCH),
            "batch_within_chance": within_chance(float(errors.mean()), sd),
            "line": line_at_one(
                np.array([lv for lv, _ in leveled], float), np.array([e for _, e in leveled])
            ),
            "at_level_mean": float(np.mean(at_level)) if at_level else math.nan,
        }
    return out


def batch_row(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One batch: its runs, mean step level and per figure (within, judged, mean signed)."""
    levels = [r["step_level"] for r in runs if r.get("step_level")]
    row: dict[str, Any] = {
        "batch": label,
        "runs": len(runs),
        "level": float(np.mean(levels)) if levels else math.nan,
    }
    for figure in FIGURES:
        within, count, mean = judged([(r.get("ttft") or {}).get(figure) for r in runs])
        row[figure] = {"within": within, "judged": count, "mean": mean}
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", help="[LABEL=]FILE from bench_fresh_profiles --out")
    parser.add_argument("--only", nargs="+", default=None, help="pool these labels apart too")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    batches = read_batches(args.files)
    rows = [batch_row(label, runs) for label, runs in batches]
    print("| batch | runs | step level | client TTFT p50: within, mean | p90: within, mean | met |")
    print("| --- | --- | --- | --- | --- | --- |")
    for row in rows:
        a, b = row["client_p50"], row["client_p90"]
        met = all(f["within"] >= BATCH - 1 and abs(f["mean"]) <= MEAN_LIMIT for f in (a, b))
        verdict = ("yes" if met else "no") if row["runs"] == BATCH else f"– ({row['runs']} runs)"
        print(
            f"| {row['batch']} | {row['runs']} | {row['level']:.3f} | {a['within']}/{a['judged']}"
            f", {pct(a['mean'])} | {b['within']}/{b['judged']}, {pct(b['mean'])} | "
            f"{verdict} |"
        )
    groups = {"every batch": [r for _, runs in batches for r in runs]}
    if args.only:
        groups[" + ".join(args.only)] = [r for lb, runs in batches if lb in args.only for r in runs]
    summary = {name: pooled(runs) for name, runs in groups.items()}
    for name, figures in summary.items():
        print(f"\npooled over {name} ({figures['runs']} runs):")
        for figure in FIGURES:
            f = figures.get(figure)
            if not f:
                continue
            line = f["line"]
            print(
                f"  {figure.replace('_', ' TTFT ')}: within max(10%, real vs real) in "
                f"{f['within']} of {f['judged']} runs (4 of {BATCH} then "
                f"{f['four_of_five_chance']:.0%} of the time, binomial); strictly within 10% "
                f"{f['strictly_within']}, the truth's own repeat {f['repeat_within']} of "
                f"{f['repeats']} (SD {100 * f['repeat_sd']:.1f}%); mean signed "
                f"{pct(f['mean'])} (SD {100 * f['sd']:.1f}% over runs, the mean's SE "
                f"{100 * f['se']:.1f} points); a batch of {BATCH}'s mean "
                f"spreads {100 * f['batch_sd']:.1f} points and lands within ±"
                f"{MEAN_LIMIT:.0%} {f['batch_within_chance']:.0%} of the time; at level 1 "
                f"(the calibration's speed) {pct(line['at_one'])} ± {100 * line['at_one_se']:.1f}"
                f" points, {line['slope']:+.2f} per unit of step level; simulated at each run's "
                f"level, mean {pct(f['at_level_mean'])}"
            )
    if args.out:
        doc = {
            "date": dt.date.today().isoformat(),
            "command": ["python -m benchmarks.fidelity.bench_main_job_pool", *sys.argv[1:]],
            "batches": rows,
            "pooled": summary,
        }
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
