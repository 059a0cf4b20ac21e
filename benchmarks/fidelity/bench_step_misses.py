"""How often a request sent to a busy engine misses the end of the step in progress, real
against simulated (issue 64, the client's TTFT tail).

The engine takes new requests only between steps. A request sent while a step runs is taken
at that step's end if its way in (the API server's intake) reaches the engine core before the
step ends, and otherwise waits for the whole next step. Per busy send (a step running at the
send) of each run: the step's remainder at the send (its end less the send, ms) and whether the
request missed that end (a step started after its send and before the engine queued it), grouped
by :data:`REMAINDER_MS`, real and simulated. Then each side's time from send to the engine's
queue (the way in and the wait for a step) at p50 / p90 / p95 / p99 over every request of every
run. A real side that misses at remainders the simulation never does is a way in with a tail the
simulation lacks.

Run: ``python -m benchmarks.fidelity.bench_step_misses RUN [RUN ...] [--variant NAME]
[--root tmp] [--out F.json]``, each RUN a pipeline run id (or ``REAL_DIR:SIM_DIR``); with
``--variant``, each run's simulation by ``bench_sim_variants`` under that name. One engine
per run (a fleet's steps would be read as one engine's).
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.fidelity.bench_tail_requests import dirs_of, markdown, run_args

REMAINDER_MS: tuple[float, ...] = (0.0, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 7.0, np.inf)
"""Bands of the step in progress's remainder at a send (ms)."""
QUANTILES: tuple[int, ...] = (50, 90, 95, 99)
AFTER_S = 2e-4
"""A step starting within this of the engine's queue stamp is the one it was queued for."""


def sends(steps: pd.DataFrame, sent_s: np.ndarray, queued_s: np.ndarray) -> pd.DataFrame:
    """Per request: whether a step ran at its send, that step's remainder (ms), whether it
    missed its end, and its time from send to the engine's queue (ms)."""
    starts = steps["start_time_s"].to_numpy(dtype=float)
    ends = steps["end_time_s"].to_numpy(dtype=float)
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], ends[order]
    k = np.searchsorted(starts, sent_s, side="right") - 1
    kk = np.maximum(k, 0)
    busy = (k >= 0) & (ends[kk] > sent_s)
    started = np.searchsorted(starts, queued_s - AFTER_S, side="left") - np.searchsorted(
        starts, sent_s, side="right"
    )
    return pd.DataFrame(
        {
            "busy": busy,
            "remainder_ms": np.where(busy, 1e3 * (ends[kk] - sent_s), np.nan),
            "missed": started > 0,
            "way_in_ms": 1e3 * (queued_s - sent_s),
        }
    )


def real_sends(real_dir: Path) -> pd.DataFrame:
    r = pd.read_csv(real_dir / "request_metrics.csv").sort_values("request_id")
    steps = pd.read_csv(real_dir / "engine_schedule.csv")
    sent = r["arrival_time_s"].to_numpy(dtype=float)
    return sends(steps, sent, r["engine_arrival_time_s"].to_numpy(dtype=float))


def sim_sends(sim_dir: Path) -> pd.DataFrame:
    s = pd.read_csv(sim_dir / "request_metrics.csv").sort_values("request_id")
    steps = pd.read_csv(sim_dir / "engine_schedule.csv")
    sent = s["arrival_time_s"].to_numpy(dtype=float)
    # reached the scheduler: the front end's way in, then held for the step in progress
    held = s["scheduling_delay_s"] - s["engine_scheduling_delay_s"]
    queued = sent + (s["frontend_input_s"] + held).to_numpy(dtype=float)
    return sends(steps, sent, queued)


def by_remainder(real: pd.DataFrame, sim: pd.DataFrame) -> list[dict[str, Any]]:
    rows = []
    for lo, hi in itertools.pairwise(REMAINDER_MS):
        row: dict[str, Any] = {"remainder_ms": f"{lo:g}–{hi:g}" if np.isfinite(hi) else f"{lo:g}+"}
        for side, table in (("real", real), ("sim", sim)):
            band = table[
                table["busy"] & (table["remainder_ms"] >= lo) & (table["remainder_ms"] < hi)
            ]
            row[f"{side}_sends"] = len(band)
            row[f"{side}_missed"] = int(band["missed"].sum())
        rows.append(row)
    return rows


def way_in(real: pd.DataFrame, sim: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {
            "side": side,
            **{f"p{q}_ms": round(float(np.nanpercentile(t["way_in_ms"], q)), 2) for q in QUANTILES},
        }
        for side, t in (("real", real), ("sim", sim))
    ]


def main(argv: list[str] | None = None) -> int:
    args = run_args(__doc__, argv)
    real, sim = [], []
    for run in args.runs:
        real_dir, sim_dir = dirs_of(run, args.root, args.variant)
        real.append(real_sends(real_dir))
        sim.append(sim_sends(sim_dir))
    r, s = pd.concat(real, ignore_index=True), pd.concat(sim, ignore_index=True)
    bands, ways = by_remainder(r, s), way_in(r, s)
    print(f"{len(args.runs)} runs, {len(r)} requests; busy sends real {int(r['busy'].sum())}, ")
    print(f"simulated {int(s['busy'].sum())}; by the step in progress's remainder at the send:\n")
    print(markdown(bands))
    print(
        "\nsend to the engine's queue (the way in and the wait for a step), every request (ms):\n"
    )
    print(markdown(ways))
    if args.out is not None:
        out = {"runs": args.runs, "variant": args.variant, "by_remainder": bands, "way_in": ways}
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
