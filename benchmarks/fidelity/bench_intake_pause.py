"""The pause before a busy step that takes a request in: real, simulated, and what it moves.

vLLM's engine core takes a new request in between two steps and stamps it queued there; on this
project's CPU host the step that schedules it starts about a millisecond after the last one ended,
where a step that takes in none starts a tenth of one after (2026-12-06). ``vidur.intake_pause``
puts that pause where it falls; before it, one mean pause before every busy step.

For stored main jobs (pipeline run ids, ``tmp/pipeline/<RUN>``), prints:

- **pauses**: the pause before a busy step (the last one's end to its start, under 5 ms) that
  schedules a prefill (a request taken in; a prompt's later chunk or a preempted request's
  restart too: none in the main job, whose prompts fit one chunk), and before one that does
  not, one engine's schedule, real (the truth's
  ``engine_schedule.csv``) and per simulation named with ``--sim NAME=PATTERN`` (a
  ``tmp/vidur_simulate`` run id with ``{run}``, e.g. ``variant-pause-{run}``): the steps, p10 /
  p50 / p90 and the mean, and each kind of step's own time beside;
- **clocks**: per comparison named with ``--compare NAME=PATTERN`` (a ``tmp/compare`` run id
  with ``{run}``), every row of both clocks (TTFT, TPOT, E2E at p50 and p90): the mean signed
  error over the runs, its spread, and how many runs are within max(10%, real vs real), the
  truth's repeat read from ``--repeat-from`` (a pattern of the comparisons made with the repeat:
  an at-level comparison has none of its own).

Run: ``python -m benchmarks.fidelity.bench_intake_pause RUN... --sim NAME=PATTERN ...
--compare NAME=PATTERN ... [--repeat-from PATTERN] [--out F.json]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.fidelity.bounds import LIMIT

BUSY_PAUSE_S = 0.005
"""A pause shorter than this follows a busy step (a longer one: the engine was idle)."""
STATS = ("p50", "p90")


def pause_kinds(schedule: pd.DataFrame) -> dict[str, dict[str, list[float]]]:
    """The pauses (ms) before the busy steps of one ``engine_schedule`` table that first-schedule
    a request (``taking``) and before the others (``quiet``), with each step's own time."""
    start = schedule["start_time_s"].to_numpy(dtype=float)
    end = schedule["end_time_s"].to_numpy(dtype=float)
    gap = start[1:] - end[:-1]
    body = end[1:] - start[1:]
    taking = schedule["num_prefill_requests"].to_numpy(dtype=int)[1:] > 0
    busy = gap < BUSY_PAUSE_S
    return {
        kind: {
            "pause_ms": [round(1e3 * float(v), 4) for v in gap[busy & mask]],
            "step_ms": [round(1e3 * float(v), 4) for v in body[busy & mask]],
        }
        for kind, mask in (("taking", taking), ("quiet", ~taking))
    }


def pooled_pauses(dirs: list[Path]) -> dict[str, dict[str, float]]:
    """:func:`pause_kinds` over every run's schedule, summarized per kind of step."""
    out: dict[str, dict[str, float]] = {}
    kinds = [pause_kinds(pd.read_csv(d / "engine_schedule.csv")) for d in dirs]
    for kind in ("taking", "quiet"):
        pause = np.concatenate([k[kind]["pause_ms"] for k in kinds])
        step = np.concatenate([k[kind]["step_ms"] for k in kinds])
        if not len(pause):
            continue
        p10, p50, p90 = np.percentile(pause, [10, 50, 90])
        out[kind] = {
            "steps": len(pause),
            "pause_p10_ms": float(p10),
            "pause_p50_ms": float(p50),
            "pause_p90_ms": float(p90),
            "pause_mean_ms": float(pause.mean()),
            "step_mean_ms": float(step.mean()),
        }
    return out


def clock_figures(compare_dir: Path, field: str) -> dict[str, float | None]:
    """``clock/metric/stat`` → one comparison's ``<field>_vs_<clock>`` on that clock:
    ``error`` (the simulation's) or ``noise`` (the truth's own repeat, real vs real)."""
    data = json.loads((compare_dir / "comparison.json").read_text())
    out: dict[str, float | None] = {}
    for row in data.get("clocks") or []:
        for clock in ("engine", "client"):
            out[f"{clock}/{row['metric']}/{row['stat']}"] = row.get(f"{field}_vs_{clock}")
    return out


def clock_summary(
    errors: list[dict[str, float | None]], noise: list[dict[str, float | None]]
) -> dict[str, dict[str, float | int]]:
    """Per row: the mean signed error over the runs, its spread, and how many runs are within
    max(10%, real vs real)."""
    out: dict[str, dict[str, float | int]] = {}
    for key in sorted(errors[0]) if errors else []:
        if key.rsplit("/", 1)[1] not in STATS:
            continue
        pairs = [(e.get(key), n.get(key)) for e, n in zip(errors, noise, strict=True)]
        values = [(e, n or 0.0) for e, n in pairs if e is not None]
        if not values:
            continue
        signed = [e for e, _ in values]
        out[key] = {
            "runs": len(values),
            "mean": statistics.mean(signed),
            "sd": statistics.pstdev(signed),
            "within": sum(abs(e) <= max(LIMIT, abs(n)) for e, n in values),
        }
    return out


def named(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, _, pattern = pair.partition("=")
        if not pattern or "{run}" not in pattern:
            raise SystemExit(f"{pair!r}: expected NAME=PATTERN with {{run}} in the pattern")
        out[name] = pattern
    return out


def report(record: dict[str, Any]) -> None:
    print("| pauses before a busy step | steps | p10 / p50 / p90 ms | mean ms | step mean ms |")
    print("| --- | --- | --- | --- | --- |")
    for side, kinds in record["pauses"].items():
        for kind, s in kinds.items():
            print(
                f"| {side}, {kind} | {s['steps']} | {s['pause_p10_ms']:.3f} / "
                f"{s['pause_p50_ms']:.3f} / {s['pause_p90_ms']:.3f} | {s['pause_mean_ms']:.3f} "
                f"| {s['step_mean_ms']:.3f} |"
            )
    clock_table(
        record["clocks"],
        lambda s: f"{s['mean']:+.1%} (sd {s['sd']:.1%}), {s['within']} of {s['runs']}",
    )


def clock_table(
    clocks: dict[str, dict[str, dict[str, Any]]], cell: Callable[[dict[str, Any]], str]
) -> None:
    """Every clock row (``clock/metric/stat``) a line, a column per setting, each cell
    ``cell(summary)`` (–: none); nothing without settings."""
    names = list(clocks)
    if not names:
        return
    print()
    print("| row | " + " | ".join(names) + " |")
    print("| --- |" + " --- |" * len(names))
    for key in clocks[names[0]]:
        cells = [cell(s) if (s := clocks[name].get(key)) is not None else "–" for name in names]
        print(f"| {key.replace('/', ' ')} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--sim", action="append", default=[])
    parser.add_argument("--compare", action="append", default=[])
    parser.add_argument("--repeat-from", default="variant-as_is-{run}")
    parser.add_argument("--root", type=Path, default=Path("tmp"))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    root = args.root
    truths = [
        Path(json.loads((root / "pipeline" / r / "run_meta.json").read_text())["stages"][
            "real_bench"]["path"])
        for r in args.runs
    ]  # fmt: skip
    pauses = {"real": pooled_pauses(truths)}
    for name, pattern in named(args.sim).items():
        pauses[name] = pooled_pauses(
            [root / "vidur_simulate" / pattern.format(run=r) for r in args.runs]
        )
    noise = [
        clock_figures(root / "compare" / args.repeat_from.format(run=r), "noise") for r in args.runs
    ]
    clocks = {
        name: clock_summary(
            [clock_figures(root / "compare" / pattern.format(run=r), "error") for r in args.runs],
            noise,
        )
        for name, pattern in named(args.compare).items()
    }
    record = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.fidelity.bench_intake_pause", *sys.argv[1:]]),
        "pauses": pauses,
        "clocks": clocks,
    }
    report(record)
    if args.out is not None:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
