"""A fidelity campaign's steps in the order they ran: did the host move between its calibration
and the real runs it is judged on?

For each RUN (a fidelity run directory, ``tmp/fidelity/<id>``), in wall-clock order: every
calibration replay's rate (the bundle's ``serving_steps.csv``, one row per rate over its rounds;
steps with a client send in them left out, as the real runs' steps cannot be) and every real
run (its ``engine_schedule.csv``), with the median time of a decode-only step of 1, 2, 4 and 8
requests, each step timed the same way (its start to its end on the engine's own record). The
same composition on the same server software: a column that moves down the table is the
host's speed (or the server's) moving, not the model.

Run: ``python -m benchmarks.fidelity.bench_campaign_timeline RUN [RUN ...]``
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

BATCHES = (1, 2, 4, 8)
MIN_STEPS = 5


def _medians(steps: pd.DataFrame) -> list[float | None]:
    """Per batch in :data:`BATCHES`: the median ms of its decode-only steps (None: too few)."""
    decode = steps[steps["num_prefill_requests"] == 0]
    ms = (decode["end_time_s"] - decode["start_time_s"]) * 1e3
    out: list[float | None] = []
    for n in BATCHES:
        x = ms[decode["num_decode_requests"] == n]
        out.append(round(float(x.median()), 2) if len(x) >= MIN_STEPS else None)
    return out


def timeline(run: Path) -> list[tuple[str, str, list[float | None]]]:
    """(wall-clock time, what ran, medians) for every calibration rate and real run of ``run``."""
    rows: list[tuple[str, str, list[float | None]]] = []
    for steps_csv in sorted(run.glob("profiles/**/serving_steps.csv")):
        meta = json.loads((steps_csv.parent / "meta.json").read_text())
        steps = pd.read_csv(steps_csv)
        quiet = steps[steps["client_sends"] == 0] if "client_sends" in steps else steps
        where = steps_csv.parent.relative_to(run / "profiles")
        own = f" {where.parts[0]}" if len(where.parts) > 2 else ""  # calibrate_each_load
        for rate, one in quiet.groupby("rate_qps"):
            rows.append((meta["created_at"], f"calibration{own} {rate:.1f}/s", _medians(one)))
    for meta_json in sorted(run.glob("runs/real_bench/*/run_meta.json")):
        schedule = meta_json.parent / "engine_schedule.csv"
        if not schedule.is_file():
            continue
        meta = json.loads(meta_json.read_text())
        label = f"real {meta_json.parent.name}"
        rows.append((meta["start_time"], label, _medians(pd.read_csv(schedule))))
    return sorted(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    head = " | ".join(f"{n:>5}" for n in BATCHES)
    for run in args.runs:
        print(f"== {run.name}: decode-only step of N requests, median ms")
        print(f"{'time':8} {'':40} {head}")
        for at, label, medians in timeline(run):
            cells = " | ".join("    -" if m is None else f"{m:5.2f}" for m in medians)
            print(f"{at[11:19]:8} {label:40} {cells}")


if __name__ == "__main__":
    main()
