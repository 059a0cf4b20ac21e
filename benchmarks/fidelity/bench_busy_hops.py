"""A busy engine's way in, the calibration's replays against the truth, on one server (issue 64).

The simulation draws a busy send's way in (send to the engine core's input) from what the
calibration's replays showed (``frontend.busy_hop_residual_ms``), and a send whose way in outlasts
the step in progress misses that step's end. This benchmark asks whether the replays' busy sends
behave as the truth's do, on the same server minutes apart, from the files the server leaves
beside its log (every request it served, calibration and truth alike): its recorded steps and
queue stamps (``engine_steps.jsonl``, the engine core's clock) and the API server's arrival stamp
of each request (``otlp_spans.jsonl``, the front end's wall clock).

Per busy send (a step running at the send), calibration replays (by their rate as a share of the
calibration's capacity estimate) and truth apart: the step's remainder at the send, whether the
request missed that step's end (a step started after its send and before the engine queued it),
its way to the API server (send to the API server's arrival stamp, the client and HTTP) and the
remainder left at that arrival. Printed: by the remainder at the send, each side's sends, share
missed and median way to the API server; by the remainder at the API server's arrival, the share
missed (the API server's part alone); per run, the truth's median way to the API server less the
replays' (remainders 2.5-10 ms); and how many of the server's queue stamps (its whole life) were
drains with work in hand (between two steps that share a request) later than
``frontend.HELD_BACK_S`` after their step's end, which calibration version 19 read as arrivals
where they were a replayed busy send's. A replayed send is paired with the calibration's one
API-server arrival within :data:`FRONT_AFTER_SEND_S` after it, sends with another close by left
out; the truth's by request id. One engine per server (a fleet's steps would interleave).

Run: ``python -m benchmarks.fidelity.bench_busy_hops RUN [RUN ...] [--root tmp] [--out F.json]``,
each RUN a pipeline run id whose ``tmp/pipeline/<run>`` holds the server's files.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.fidelity.bench_step_misses import AFTER_S
from benchmarks.fidelity.bench_tail_requests import markdown, run_args
from gpu_simulate_test.calibration.frontend import HELD_BACK_S
from gpu_simulate_test.calibration.intake_phase import CLIENT_SEND_OFFSETS

REMAINDER_MS: tuple[float, ...] = (0.0, 2.0, 3.0, 3.5, 4.0, 5.0, 6.0, 10.0, np.inf)
"""Bands of the step in progress's remainder at the send (ms)."""
AT_FRONT_MS: tuple[float, ...] = (-np.inf, 0.5, 1.0, 1.5, 2.0, 3.0, np.inf)
"""Bands of the remainder left when the API server stamped the request's arrival (ms)."""
SHARES: tuple[tuple[float, str], ...] = ((0.1, "replays <=10%"), (0.45, "replays ~30%"))
"""Replay rates (share of the calibration's capacity estimate) up to each bound, their label;
above the last: ``replays ~60%``."""
COMPARED_MS = (2.5, 10.0)
"""The remainders over which each run's way to the API server is compared."""
FRONT_AFTER_SEND_S = 0.01
"""A replayed send's API-server arrival: the one calibration request the API server stamped
within this after it; a send with none or two there (another send's close by) is left out."""
MAX_OFFSET_SPREAD_S = 1e-3
"""The truth's requests' wall-clock arrivals less their stamps on the run's clock: one offset,
within this, or the run token is not the truth's."""


@dataclass(frozen=True)
class ServerLog:
    """A server's ``engine_steps.jsonl`` (the engine core's clock): its steps, in start order,
    with the requests each ran, and every queue stamp (request tag, time) in the file's order."""

    steps: np.ndarray
    """(start, end) rows."""
    ran: list[frozenset[str]]
    queued: list[tuple[str, float]]

    @classmethod
    def read(cls, run_dir: Path) -> ServerLog:
        steps: list[tuple[float, float, frozenset[str]]] = []
        queued: list[tuple[str, float]] = []
        with (run_dir / "engine_steps.jsonl").open() as handle:
            for line in handle:
                entry = json.loads(line)
                if "q" in entry:
                    queued.append((str(entry["q"]).rsplit("-", 1)[0], float(entry["t"])))
                elif "s" in entry and "e" in entry:
                    ids = frozenset(str(r[0]) for r in entry.get("r") or [])
                    steps.append((float(entry["s"]), float(entry["e"]), ids))
        steps.sort(key=lambda step: step[:2])
        spans = np.array([step[:2] for step in steps], dtype=float).reshape(-1, 2)
        return cls(spans, [step[2] for step in steps], queued)


def api_arrivals(run_dir: Path) -> pd.DataFrame:
    """The API server's arrival stamp of each request (``tag``, ``wall_s``), from the server's
    ``otlp_spans.jsonl``; a tag served twice (a warm-up and the request of the same id): the
    later, as the queue stamps' reading keeps."""
    path = run_dir / "otlp_spans.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: the server's spans are needed (a vLLM server run here)")
    with path.open() as handle:
        spans = [json.loads(line) for line in handle]
    front = pd.DataFrame(
        {
            "tag": [s["request_id"] for s in spans],
            "wall_s": [float(s["front_arrival_wall_s"]) for s in spans],
        }
    )
    return front.drop_duplicates("tag", keep="last")


def late_drains(log: ServerLog) -> dict[str, Any]:
    """Every queue stamp of the server's life (calibration experiments and replays, truth and
    repeat) that lies between two steps sharing a request (the engine had work, so the stamp is
    a drain of its input, not an arrival): how many, and how many came later than
    ``frontend.HELD_BACK_S`` after the step's end (where a busy send's, version 19 read it as
    the arrival)."""
    ends = log.steps[:, 1]
    late_ms = []
    for _, t in log.queued:
        k = int(np.searchsorted(ends, t, side="right")) - 1
        if 0 <= k < len(ends) - 1 and log.steps[k + 1, 0] >= t and log.ran[k] & log.ran[k + 1]:
            late_ms.append(1e3 * (t - ends[k]))
    late = np.asarray(late_ms)
    return {
        "stamps": len(log.queued),
        "drains_with_work": len(late),
        "after_held_back": int((late > 1e3 * HELD_BACK_S).sum()),
        "after_end_p50_p90_ms": [round(float(v), 3) for v in np.percentile(late, [50, 90])]
        if len(late)
        else [],
    }


def clock_offset(steps: np.ndarray, starts: np.ndarray) -> float:
    """The offset taking a table's step starts (its run's clock) to the server's recorded ones:
    the one under which its first steps' starts are recorded starts."""
    first = np.sort(starts)[: min(len(starts), 20)]
    for offset in steps[:, 0] - first[0]:
        k = np.clip(np.searchsorted(steps[:, 0], first + offset), 0, len(steps) - 1)
        if np.all(np.abs(steps[k, 0] - (first + offset)) < 1e-6):
            return float(offset)
    raise ValueError("the table's steps are not among the server's recorded steps")


def busy_sends(
    sent: np.ndarray, front: np.ndarray, queued: np.ndarray, steps: np.ndarray
) -> pd.DataFrame:
    """Per send (engine clock): busy, the remainder at the send and at the API server's arrival
    (ms), missed, the way to the API server (ms)."""
    k = np.searchsorted(steps[:, 0], sent, side="right") - 1
    kk = np.maximum(k, 0)
    busy = (k >= 0) & (steps[kk, 1] > sent)
    started = np.searchsorted(steps[:, 0], queued - AFTER_S, side="left") - np.searchsorted(
        steps[:, 0], sent, side="right"
    )
    return pd.DataFrame(
        {
            "busy": busy,
            "remainder_ms": 1e3 * (steps[kk, 1] - sent),
            "at_front_ms": 1e3 * (steps[kk, 1] - front),
            "missed": started > 0,
            "to_front_ms": 1e3 * (front - sent),
        }
    )[busy]


def one_run(run: str, root: Path, log: ServerLog) -> pd.DataFrame:
    """Both sides' busy sends of one stored pipeline run (``log``: its server's)."""
    stages = json.loads((root / "pipeline" / run / "run_meta.json").read_text())["stages"]
    steps, queued = log.steps, dict(log.queued)  # a tag queued twice: the later
    front = api_arrivals(root / "pipeline" / run)
    real_dir = Path(stages["real_bench"]["path"])
    truth = pd.read_csv(real_dir / "request_metrics.csv").set_index("request_id").sort_index()
    schedule = pd.read_csv(real_dir / "engine_schedule.csv")
    to_engine = clock_offset(steps, schedule["start_time_s"].to_numpy(dtype=float))
    stamps = pd.read_csv(real_dir / "front_end_stamps.csv").set_index("request_id")
    front["id"] = front["tag"].str.extract(r"^cmpl-[^-]+-(-?\d+)", expand=False).astype(float)
    front["run"] = front["tag"].str.extract(r"^cmpl-([^-]+)-", expand=False)
    wall = {  # wall clock -> the truth's clock: the run token whose ids the stamps match
        tok: g.set_index("id")["wall_s"] for tok, g in front.groupby("run") if len(g) >= 10
    }
    fit = {tok: stamps["front_arrival_time_s"].reindex(w.index) - w for tok, w in wall.items()}
    spread = {tok: float(f.std()) if f.count() >= 10 else float("inf") for tok, f in fit.items()}
    best = min(spread, key=lambda tok: (spread[tok], -fit[tok].count()), default=None)
    if best is None or not spread[best] <= MAX_OFFSET_SPREAD_S:
        raise ValueError(f"{real_dir}: no run token's API-server arrivals match its stamps")
    front["engine_s"] = front["wall_s"] + float(fit[best].median()) + to_engine
    front["queued"] = front["tag"].map(queued)
    mine = front[front["run"] == best].set_index("id")
    stamped = truth[["arrival_time_s", "engine_arrival_time_s"]].notna().all(axis=1)
    ids = truth.index[stamped].intersection(mine.index[mine["engine_s"].notna()])
    real = busy_sends(
        truth.loc[ids, "arrival_time_s"].to_numpy(dtype=float) + to_engine,
        mine.loc[ids, "engine_s"].to_numpy(dtype=float),
        truth.loc[ids, "engine_arrival_time_s"].to_numpy(dtype=float) + to_engine,
        steps,
    ).assign(side="truth")
    bundle = Path(stages["vidur_profile"]["path"])  # this run's own calibration
    calibration = front[front["run"] == front["run"].value_counts().idxmax()]  # most requests
    return pd.concat([real, replay_sends(bundle, steps, calibration)]).assign(run=run)


def replay_sends(bundle: Path, steps: np.ndarray, front: pd.DataFrame) -> pd.DataFrame:
    """The calibration replays' busy sends (``serving_steps.csv`` ``client_send_offsets_ms``),
    each paired with the calibration's one API-server arrival within
    :data:`FRONT_AFTER_SEND_S` after it (none or two: left out), by the replay's rate."""
    table = pd.read_csv(bundle / "serving_steps.csv", keep_default_na=False)
    calibration = json.loads((bundle / "meta.json").read_text())["engine_calibration"]
    capacity = float(next(iter(calibration.values()))["serving"]["capacity_qps_estimate"])
    to_engine = clock_offset(steps, table["start_time_s"].to_numpy(dtype=float))
    sent: list[float] = []
    rate: list[float] = []
    for start, offsets, qps in zip(
        table["start_time_s"].astype(float),
        table[CLIENT_SEND_OFFSETS].astype(str),
        table["rate_qps"].astype(float),
        strict=True,
    ):
        for offset in filter(None, offsets.split(";")):
            sent.append(start + float(offset) / 1e3 + to_engine)
            rate.append(qps)
    ordered = front.dropna(subset=["queued"]).sort_values("engine_s")
    arrivals = ordered["engine_s"].to_numpy(dtype=float)
    at = np.searchsorted(arrivals, np.asarray(sent), side="left")
    within = np.searchsorted(arrivals, np.asarray(sent) + FRONT_AFTER_SEND_S, side="left") - at
    paired = within == 1
    at = np.minimum(at, len(arrivals) - 1)
    out = busy_sends(
        np.asarray(sent)[paired],
        arrivals[at][paired],
        ordered["queued"].to_numpy(dtype=float)[at][paired],
        steps,
    )
    share = (np.asarray(rate)[paired] / capacity)[out.index]
    labels = np.full(len(out), "replays ~60%", dtype=object)
    for bound, label in reversed(SHARES):
        labels[share <= bound] = label
    return out.assign(side=labels)


def banded(table: pd.DataFrame, column: str, edges: tuple[float, ...]) -> list[dict[str, Any]]:
    bands = pd.cut(table[column], list(edges), right=False)
    rows = []
    for (interval, side), group in table.groupby([bands, "side"], observed=True):
        assert isinstance(interval, pd.Interval)
        rows.append(
            {
                column: f"{interval.left:g}–{interval.right:g}",
                "side": side,
                "sends": len(group),
                "missed": round(float(group["missed"].mean()), 3),
                "to_front_p50_ms": round(float(group["to_front_ms"].median()), 2),
            }
        )
    return rows


def per_run(table: pd.DataFrame) -> list[dict[str, Any]]:
    lo, hi = COMPARED_MS
    near = table[(table["remainder_ms"] >= lo) & (table["remainder_ms"] < hi)]
    rows = []
    for run, group in near.groupby("run"):
        real = group[group["side"] == "truth"]
        replays = group[group["side"] != "truth"]
        difference = float(real["to_front_ms"].median() - replays["to_front_ms"].median())
        rows.append(
            {
                "run": run,
                "truth_sends": len(real),
                "truth_missed": round(float(real["missed"].mean()), 3),
                "replay_sends": len(replays),
                "replay_missed": round(float(replays["missed"].mean()), 3),
                "to_front_truth_less_replays_ms": round(difference, 3),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    args = run_args(__doc__, argv, variant=False)
    logs = {run: ServerLog.read(args.root / "pipeline" / run) for run in args.runs}
    table = pd.concat([one_run(run, args.root, logs[run]) for run in args.runs], ignore_index=True)
    at_send = banded(table, "remainder_ms", REMAINDER_MS)
    at_front = banded(table, "at_front_ms", AT_FRONT_MS)
    runs = per_run(table)
    drains = {run: late_drains(log) for run, log in logs.items()}
    print(f"{len(args.runs)} runs; busy sends by the step in progress's remainder at the send:\n")
    print(markdown(at_send))
    print("\nby the remainder left at the API server's arrival stamp (its part alone):\n")
    print(markdown(at_front))
    lo, hi = COMPARED_MS
    print(f"\nper run, remainders {lo:g}–{hi:g} ms (way to the API server, truth less replays):\n")
    print(markdown(runs))
    later = [r["to_front_truth_less_replays_ms"] for r in runs]
    print(
        f"\nthe truth's way to the API server later than the replays' in "
        f"{sum(d > 0 for d in later)} of {len(later)} runs, mean {np.mean(later):+.3f} ms"
    )
    with_work = sum(d["drains_with_work"] for d in drains.values())
    held = sum(d["after_held_back"] for d in drains.values())
    print(
        f"queue stamps between two steps sharing a request (drains with work in hand): "
        f"{with_work}, of which {held} ({held / max(with_work, 1):.1%}) more than "
        f"{1e3 * HELD_BACK_S:g} ms after the step's end"
    )
    if args.out is not None:
        out = {
            "runs": args.runs,
            "at_send": at_send,
            "at_front": at_front,
            "per_run": runs,
            "late_drains": drains,
        }
        args.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
