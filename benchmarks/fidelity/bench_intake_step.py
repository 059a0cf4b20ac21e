"""A busy step that takes a request in, and every setting read over several simulation seeds.

vLLM's engine core sets a new request up in the step that schedules it for the first time;
``vidur.intake_step`` adds what the calibration replays' such busy steps took beyond the others
(:mod:`gpu_simulate_test.calibration.intake_step`). For stored main jobs (pipeline run ids,
``tmp/pipeline/<RUN>``) this prints:

- **terms**: per simulation named with ``--sim PATTERN`` (a ``tmp/vidur_simulate`` run id with
  ``{run}``), the fitted ``intake_step_ms`` of each run's calibration: p10 / median / p90 /
  mean and how many are above zero;
- **clocks over seeds**: per setting named with ``--setting NAME=PATTERN[,PATTERN...]`` (one
  ``tmp/compare`` pattern per simulation seed), every row of both clocks (TTFT, TPOT, E2E at
  p50 and p90): each seed's mean signed error over the runs, their mean and range, and the runs
  within max(10%, real vs real) averaged over the seeds; the truth's repeat from
  ``--repeat-from``. Every run of one workload simulated with one seed draws the same: twenty
  runs on the default seed are one draw of the simulation's spreads, not twenty (2026-12-06:
  the engine's TTFT p90 +5.4% on the default seed, +1.0 to +3.2% on three others).

Run: ``python -m benchmarks.fidelity.bench_intake_step RUN... [--sim PATTERN]
--setting NAME=PATTERN,... ... [--repeat-from PATTERN] [--out F.json]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.fidelity.bench_intake_pause import clock_figures, clock_summary, clock_table


def terms(dirs: list[Path]) -> dict[str, Any]:
    """The fitted ``intake_step_ms`` of each simulation's serving terms, summarized."""
    values = []
    for d in dirs:
        serving = json.loads((d / "run_meta.json").read_text()).get("serving_load") or {}
        values.append(float((serving.get("terms") or {}).get("intake_step_ms", 0.0)))
    return {
        "runs": len(values),
        "values_ms": [round(v, 4) for v in values],
        "p10_ms": float(np.percentile(values, 10)),
        "median_ms": float(np.median(values)),
        "p90_ms": float(np.percentile(values, 90)),
        "mean_ms": float(np.mean(values)),
        "above_zero": sum(v > 0 for v in values),
    }


def over_seeds(per_seed: list[dict[str, dict[str, float | int]]]) -> dict[str, dict[str, Any]]:
    """Per row: each seed's mean signed error, their mean and range, and the runs within
    averaged over the seeds."""
    out: dict[str, dict[str, Any]] = {}
    for key in per_seed[0] if per_seed else []:
        seeds = [s[key] for s in per_seed if key in s]
        means = [float(s["mean"]) for s in seeds]
        out[key] = {
            "seeds": len(seeds),
            "seed_means": means,
            "mean": statistics.mean(means),
            "low": min(means),
            "high": max(means),
            "within": statistics.mean(float(s["within"]) for s in seeds),
            "runs": int(seeds[0]["runs"]),
        }
    return out


def settings(pairs: list[str]) -> dict[str, list[str]]:
    out = {}
    for pair in pairs:
        name, _, patterns = pair.partition("=")
        listed = [p for p in patterns.split(",") if p]
        if not listed or any("{run}" not in p for p in listed):
            raise SystemExit(f"{pair!r}: expected NAME=PATTERN[,PATTERN...] with {{run}} in each")
        out[name] = listed
    return out


def report(record: dict[str, Any]) -> None:
    for name, t in record["terms"].items():
        print(
            f"intake_step_ms ({name}, {t['runs']} calibrations): p10 / median / p90 "
            f"{t['p10_ms']:.3f} / {t['median_ms']:.3f} / {t['p90_ms']:.3f}, mean "
            f"{t['mean_ms']:.3f}, above zero in {t['above_zero']}"
        )
    clock_table(
        record["clocks"],
        lambda s: (
            f"{s['mean']:+.1%} ({s['low']:+.1%}..{s['high']:+.1%} over {s['seeds']} "
            f"seeds), {s['within']:.1f} of {s['runs']}"
        ),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--sim", action="append", default=[])
    parser.add_argument("--setting", action="append", default=[])
    parser.add_argument("--repeat-from", default="variant-as_is-{run}")
    parser.add_argument("--root", type=Path, default=Path("tmp"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    root = args.root
    noise = [
        clock_figures(root / "compare" / args.repeat_from.format(run=r), "noise") for r in args.runs
    ]
    clocks = {}
    for name, patterns in settings(args.setting).items():
        per_seed = [
            clock_summary(
                [clock_figures(root / "compare" / p.format(run=r), "error") for r in args.runs],
                noise,
            )
            for p in patterns
        ]
        clocks[name] = over_seeds(per_seed)
    record = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.fidelity.bench_intake_step", *sys.argv[1:]]),
        "terms": {
            p: terms([root / "vidur_simulate" / p.format(run=r) for r in args.runs])
            for p in args.sim
        },
        "clocks": clocks,
    }
    report(record)
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
