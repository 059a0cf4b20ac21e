"""Does a busy request catch the step its send fell in? The real engine against the simulation.

For every request sent while the engine ran a step (a busy send), this reads where that step
ended, counted from the send, and whether the request was taken in at that end (queued within
1 ms of it: it "caught" the step) or waited for a later one; and its whole way in (send → queued
by the engine). Real: the pipeline run's real bench (``engine_schedule.csv``, the engine's own
stamps). Simulated: its simulation, and each ``bench_sim_variants`` variant named by
``--variant`` (``tmp/vidur_simulate/variant-<name>-<run>``), e.g. ``vidur.intake_catch``.

On this project's CPU host the real ends pile up 2–3.5 ms after the send and almost none fall
0.7–2 ms after it: a step's end waits for the API server's intake (``vidur.intake_catch``).

A second table counts the sends that missed their step's end and takes apart the wait of those
queued at the next step's end: where the missed step ended after the send, how long it and the
step after it ran, and how long after that end the request was queued (on five main jobs of
2026-12-06 the real ones waited 2.6 ms longer than the simulated ones on average, and 0.6 ms
longer than those simulated at the real runs' step level: mostly the host's speed, not the
catch). ``--at-level`` adds each run's simulation at its real run's step level (the compare's
``<run>-at-level``).

With ``--bundles``: the same read off calibration bundles' replays instead (their
``serving_steps.csv``: each busy step with one client send, the send's offset into it, and the
next request first scheduled; caught when that is the very next step, busy back to back).

Run: ``python -m benchmarks.fidelity.bench_intake_catch RUN [RUN ...] [--variant NAME ...]
[--at-level]``
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
SAME_S = 1e-6
"""A queueing this close to a step's end is at it (the simulation queues exactly there)."""
COLUMNS = ("end_ms", "way_in_ms", "caught")
MISS_COLUMNS = ("step_ms", "next_ms", "stamp_ms", "ends_waited")


def busy_sends(run_dir: Path, sim: bool) -> pd.DataFrame:
    """Per busy send of a run: ``end_ms`` (its step's end after the send), ``way_in_ms`` (send
    → queued), ``caught``, and for :func:`misses`: ``step_ms`` (the step under way), ``next_ms``
    (the step after it), ``stamp_ms`` (queued after the last step end before it) and
    ``ends_waited`` (the step ends from the send to the queueing)."""
    requests = pd.read_csv(run_dir / "request_metrics.csv")
    requests = requests[requests["status"] == "ok"]
    steps = pd.read_csv(run_dir / "engine_schedule.csv").sort_values("start_time_s")
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
        k = under[0]
        e = end[k]
        caught = q - e < CAUGHT_MS / 1e3
        passed = end[(end > a) & (end <= q + SAME_S)]
        rows.append(
            {
                "end_ms": 1e3 * (e - a),
                "way_in_ms": 1e3 * (q - a),
                "caught": caught,
                "step_ms": 1e3 * (e - start[k]),
                "next_ms": 1e3 * (end[k + 1] - start[k + 1]) if k + 1 < len(end) else np.nan,
                "stamp_ms": 1e3 * (q - passed.max()) if len(passed) else np.nan,
                "ends_waited": len(passed),
            }
        )
    return pd.DataFrame(rows, columns=[*COLUMNS, *MISS_COLUMNS])


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
    return pd.DataFrame(rows, columns=list(COLUMNS))


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


def miss_parts(table: pd.DataFrame) -> dict[str, float]:
    """The busy sends that missed their step's end (queued :data:`CAUGHT_MS` or more after it):
    how many; how many were queued at the next step's end (within :data:`CAUGHT_MS` of it) and,
    over those, the means of their way in, where their step ended after the send, how long it
    and the step after it ran and how long after that end they were queued; the others (queued
    while the step after ran or into a pause) counted apart; the caught ones' step under way."""
    missed, caught = table[~table["caught"]], table[table["caught"]]
    at_next = missed[(missed["ends_waited"] == 2) & (missed["stamp_ms"] < CAUGHT_MS)]

    def mean(frame: pd.DataFrame, column: str) -> float:
        return float(frame[column].mean()) if len(frame) else float("nan")

    return {
        "sends": float(len(table)),
        "missed": float(len(missed)),
        "at_next_end": float(len(at_next)),
        "otherwise": float(len(missed) - len(at_next)),
        "way_in_ms": mean(at_next, "way_in_ms"),
        "end_ms": mean(at_next, "end_ms"),
        "step_ms": mean(at_next, "step_ms"),
        "caught_step_ms": mean(caught, "step_ms"),
        "next_ms": mean(at_next, "next_ms"),
        "stamp_ms": mean(at_next, "stamp_ms"),
    }


def misses(name: str, frames: list[pd.DataFrame]) -> None:
    """One row of the misses' table (:func:`miss_parts`)."""
    parts = miss_parts(pd.concat(frames, ignore_index=True))
    counts = (
        f"{int(parts['missed'])} of {int(parts['sends'])} | {int(parts['at_next_end'])} | "
        f"{int(parts['otherwise'])}"
    )
    keys = ("way_in_ms", "end_ms", "step_ms", "caught_step_ms", "next_ms", "stamp_ms")
    print(f"| {name} | {counts} | " + " | ".join(f"{parts[k]:.2f}" for k in keys) + " |")


def misses_header() -> str:
    return "\n".join(
        [
            "",
            f"busy sends that missed their step's end (queued {CAUGHT_MS:g} ms or more after it);",
            "over those queued at the next step's end, their wait taken apart (means, ms)",
            "",
            "| side | missed | at the next step's end | otherwise | way in | the step's end "
            "after the send | the step under way | (caught: the step under way) | the step "
            "after | queued after its end |",
            "|" + " --- |" * 10,
        ]
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
    parser.add_argument(
        "--at-level",
        action="store_true",
        help="also each run's simulation at its real run's step level (the compare's)",
    )
    args = parser.parse_args()
    if args.bundles:
        print(header())
        side("calibration replays", [replay_sends(b) for b in args.bundles])
        return
    real: list[pd.DataFrame] = []
    simulated: list[pd.DataFrame] = []
    variants: dict[str, list[pd.DataFrame]] = {v: [] for v in args.variant}
    if args.at_level:
        variants["at the real run's step level"] = []
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
        if args.at_level:
            at_level = Path("tmp") / "pipeline" / run / "runs" / "vidur_simulate"
            variants["at the real run's step level"].append(
                busy_sends(at_level / f"{run}-at-level", sim=True)
            )
    print(header())
    side("real", real)
    side("simulated", simulated)
    for v, frames in variants.items():
        side(f"simulated, {v}", frames)
    print(misses_header())
    misses("real", real)
    misses("simulated", simulated)
    for v, frames in variants.items():
        misses(f"simulated, {v}", frames)


if __name__ == "__main__":
    main()
