"""Does a busy request catch the step its send fell in? The real engine against the simulation.

For every request sent while the engine ran a step (a busy send), this reads where that step
ended, counted from the send, and whether the request was taken in at that end (queued within
1 ms of it: it "caught" the step) or waited for a later one; and its whole way in (send → queued
by the engine). Real: the pipeline run's real bench (``engine_schedule.csv``, the engine's own
stamps). Simulated: its simulation, and each ``bench_sim_variants`` variant named by
``--variant`` (``tmp/vidur_simulate/variant-<name>-<run>``), e.g. ``vidur.intake_catch``.

On this project's CPU host the real ends pile up 2–3.5 ms after the send and almost none fall
0.7–2 ms after it: a step's end waits for the API server's intake (``vidur.intake_catch``).

With ``--bundles``: the same read off calibration bundles' replays instead (their
``serving_steps.csv``: each busy step with one client send, the send's offset into it, and the
next request first scheduled; caught when that is the very next step, busy back to back).

Run: ``python -m benchmarks.fidelity.bench_intake_catch RUN [RUN ...] [--variant NAME ...]``
(RUN: a pipeline run id under ``tmp/pipeline``, e.g. from ``bench_fresh_profiles``), or
``python -m benchmarks.fidelity.bench_intake_catch --bundles BUNDLE [BUNDLE ...]`` (a bundle
directory, e.g. ``tmp/profiles/fresh/<run>/cpu/qwen3_tiny``).
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.intake_phase import CLIENT_SEND_OFFSETS, parse_offsets

BINS_MS = (0.0, 0.7, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 20.0)
"""Where the step running at the send ended, ms after the send."""
CAUGHT_MS = 1.0
"""Queued within this long of that end: taken in at it."""
MISSED_MS = 8.0
"""A way in this long waited for a whole later step (the tiny model's decode step)."""


def busy_sends(run_dir: Path, sim: bool) -> pd.DataFrame:
    """Per busy send of a run: ``end_ms`` (its step's end after the send), ``way_in_ms`` (send
    → queued) and ``caught``."""
    requests = pd.read_csv(run_dir / "request_metrics.csv")
    requests = requests[requests["status"] == "ok"]
    steps = pd.read_csv(run_dir / "engine_schedule.csv")
    start, end = steps["start_time_s"].to_numpy(), steps["end_time_s"].to_numpy()
    sent = requests["arrival_time_s"].to_numpy(dtype=float)
    if sim:  # the simulated way in: the front end's hop and the wait for the step under way
        queued = sent + requests["frontend_input_s"].to_numpy() + requests["held_back_s"]
    else:
        queued = requests["engine_arrival_time_s"].to_numpy(dtype=float)
    rows = []
    for a, q in zip(sent, np.asarray(queued, dtype=float), strict=True):
        under = np.flatnonzero((start <= a) & (end > a))
        if not len(under):
            continue
        e = end[under[0]]
        caught = q - e < CAUGHT_MS / 1e3
        rows.append({"end_ms": 1e3 * (e - a), "way_in_ms": 1e3 * (q - a), "caught": caught})
    return pd.DataFrame(rows, columns=["end_ms", "way_in_ms", "caught"])


def replay_sends(bundle: Path) -> pd.DataFrame:
    """Per one-send busy step of a bundle's calibration replays followed at once by another
    step: ``end_ms`` (the step's end after the send) and ``caught`` (the next request first
    scheduled in the very next step); no way in (the replays keep no request stamps)."""
    steps = pd.read_csv(bundle / "serving_steps.csv")
    rows = []
    for _, replay in steps.groupby("replay", sort=False):
        replay = replay.sort_values("step_index").reset_index(drop=True)
        seen: set[str] = set()
        new_at = []  # the steps that schedule a request for the first time
        for i, cell in enumerate(replay["requests"].fillna("").astype(str)):
            ids = {token.split(":")[0] for token in cell.split()}
            if ids - seen:
                new_at.append(i)
            seen |= ids
        start = replay["start_time_s"].to_numpy()
        end = replay["end_time_s"].to_numpy()
        for i, row in enumerate(replay.to_dict("records")):
            offsets = parse_offsets(row.get(CLIENT_SEND_OFFSETS))
            if len(offsets) != 1:
                continue
            later = [k for k in new_at if k > i]
            if not later or i + 1 >= len(replay) or start[i + 1] - end[i] > BACK_TO_BACK_S:
                continue
            rows.append(
                {
                    "end_ms": 1e3 * (end[i] - start[i]) - float(offsets[0]),
                    "way_in_ms": float("nan"),
                    "caught": later[0] == i + 1,
                }
            )
    return pd.DataFrame(rows, columns=["end_ms", "way_in_ms", "caught"])


BACK_TO_BACK_S = 0.002
"""A step followed this soon by the next: the engine stayed busy."""


def side(name: str, frames: list[pd.DataFrame]) -> None:
    table = pd.concat(frames, ignore_index=True)
    if table.empty:
        print(f"{name}: no busy sends")
        return
    binned = pd.cut(table["end_ms"], list(BINS_MS))
    counts = table.groupby(binned, observed=False)["caught"].agg(["count", "sum"])
    cells = " | ".join(f"{int(c['sum'])} / {int(c['count'])}" for _, c in counts.iterrows())
    way = table["way_in_ms"].dropna().to_numpy()
    if not len(way):  # a calibration's replays: no way in
        print(f"| {name} | {len(table)} | {cells} | – | – | – |")
        return
    quantiles = np.percentile(way, [50, 90, 99])
    print(
        f"| {name} | {len(table)} | {cells} | {way.mean():.2f} | "
        + " / ".join(f"{v:.2f}" for v in quantiles)
        + f" | {int((way > MISSED_MS).sum())} |"
    )


def header() -> str:
    bins = [f"{lo:g}–{hi:g}" for lo, hi in itertools.pairwise(BINS_MS)]
    return "\n".join(
        [
            "busy sends: where the step under way ended after the send (ms), caught / all per bin;",
            f"the way in (send → queued, ms): mean, p50 / p90 / p99; waits over {MISSED_MS:g} ms",
            "",
            "| side | sends | " + " | ".join(bins) + " | mean | p50 / p90 / p99 | waits |",
            "|" + " --- |" * (len(bins) + 5),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*")
    parser.add_argument("--variant", action="append", default=[])
    parser.add_argument("--bundles", nargs="+", type=Path, default=None)
    args = parser.parse_args()
    if args.bundles:
        print(header())
        side("calibration replays", [replay_sends(b) for b in args.bundles])
        return
    real: list[pd.DataFrame] = []
    simulated: list[pd.DataFrame] = []
    variants: dict[str, list[pd.DataFrame]] = {v: [] for v in args.variant}
    for run in args.runs:
        stages = json.loads((Path("tmp") / "pipeline" / run / "run_meta.json").read_text())[
            "stages"
        ]
        real.append(busy_sends(Path(stages["real_bench"]["path"]), sim=False))
        simulated.append(busy_sends(Path(stages["vidur_simulate"]["path"]), sim=True))
        for v in args.variant:
            variants[v].append(
                busy_sends(Path("tmp") / "vidur_simulate" / f"variant-{v}-{run}", sim=True)
            )
    print(header())
    side("real", real)
    side("simulated", simulated)
    for v, frames in variants.items():
        side(f"simulated, {v}", frames)


if __name__ == "__main__":
    main()
