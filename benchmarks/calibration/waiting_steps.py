"""Do vLLM's steps slow down because requests wait, or do requests wait because steps slowed?

A configuration whose token budget or ``max_num_seqs`` makes requests wait shows slower steps
while they wait (tune_20261127: 8 decodes 16.4 ms with none waiting, 19.2 ms with 16–63). If
waiting itself slowed a step (the front end's work per request received, the scheduler's per
waiting request), the serving terms would need a waiting term; if slow moments of the host make
requests wait, the calibrated slow moments (``serving_load.noise``) already carry it. This sets
the engine's own steps side by side without a model:

- steps of the same composition (prefill requests and tokens, decodes) by requests waiting;
- the same, by requests *received* per second over the 0.5 s before the step (taken in plus the
  change in the waiting queue: the front end's work happens when a request arrives, not when it
  is scheduled) — a waiting effect that stays at the same received rate is not the front end's;
- the steps' spread in log time around their composition's median and its autocorrelation
  (lags 1 and 4), in the bundle's calibration replays against the judged servers: the slow
  moments the simulation draws come from the replays.

Run: ``python -m benchmarks.calibration.waiting_steps <bundle dir> <engine_schedule.csv> [...]``
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.serving_load import WINDOW_S, step_features

WAITING_BINS = [-1, 0, 4, 16, 10_000]
WAITING_LABELS = ["0", "1-4", "5-16", ">16"]


def steps(schedule: pd.DataFrame, label: str) -> pd.DataFrame:
    """One replay's busy steps: composition, waiting, taken-in and received rates, body (ms)."""
    schedule = schedule.reset_index(drop=True)
    f = step_features(schedule)
    start = schedule["start_time_s"].to_numpy(dtype=float)
    end = schedule["end_time_s"].to_numpy(dtype=float)
    waiting_after = np.concatenate([[0], schedule["num_waiting"].to_numpy(dtype=int)])
    lo = np.searchsorted(end, start - WINDOW_S, side="right")
    hi = np.searchsorted(end, start, side="right")
    out = pd.DataFrame(
        {
            "run": label,
            "prompts": schedule["num_prefill_requests"].to_numpy(dtype=int),
            "prompt_tokens": schedule["num_prefill_tokens"].to_numpy(dtype=int),
            "decodes": schedule["num_decode_requests"].to_numpy(dtype=int),
            "waiting": f["waiting"].to_numpy(dtype=int),
            "taken_in": f["arrival_rate"].to_numpy(dtype=float),
            "received": f["arrival_rate"].to_numpy(dtype=float)
            + (waiting_after[hi] - waiting_after[lo]) / WINDOW_S,
            "body_ms": f["body_s"].to_numpy(dtype=float) * 1e3,
            "busy": f["busy"].to_numpy(dtype=bool),
        }
    )
    out = out[out["busy"]].drop(columns="busy")
    out["waiting_bin"] = pd.cut(out["waiting"], WAITING_BINS, labels=WAITING_LABELS)
    return out


def load(paths: list[Path]) -> pd.DataFrame:
    """Busy steps of each ``engine_schedule.csv`` (or the bundle's ``serving_steps.csv``, one
    replay at a time)."""
    parts = []
    for path in paths:
        table = pd.read_csv(path)
        if "replay" in table:
            parts += [steps(p, f"{path.name}:{k}") for k, p in table.groupby("replay", sort=False)]
        else:
            parts.append(steps(table, str(path.parent.name)))
    return pd.concat(parts, ignore_index=True)


def by_waiting(frame: pd.DataFrame, rows: pd.Series, title: str) -> str:
    table = frame.pivot_table(
        index=rows, columns="waiting_bin", values="body_ms", aggfunc=["mean", "count"],
        observed=False,
    )  # fmt: skip
    return f"{title}\n\n```\n{table.round(2).to_string()}\n```\n"


def spread(frame: pd.DataFrame) -> dict[str, float]:
    """The steps' spread in log time around their composition's median, and its autocorrelation
    at lags 1 and 4 within each run."""
    key = (
        frame["prompts"].astype(str)
        + ":"
        + ((frame["prompt_tokens"] + 7) // 8).astype(str)
        + ":"
        + (np.minimum(frame["decodes"], 16) // 2).astype(str)
    )
    frame = frame.assign(key=key.to_numpy())
    median = frame.groupby("key")["body_ms"].transform("median")
    resid = np.log(frame["body_ms"] / median)
    resid = resid - resid.mean()
    out = {"steps": float(len(frame)), "sigma": float(resid.std())}
    for lag in (1, 4):
        xs, ys = [], []
        for _, idx in frame.groupby("run").groups.items():
            values = resid.loc[idx].to_numpy()
            if len(values) > lag:
                xs.append(values[:-lag])
                ys.append(values[lag:])
        out[f"autocorr_{lag}"] = float(np.corrcoef(np.concatenate(xs), np.concatenate(ys))[0, 1])
    return out


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__.split("Run: ")[-1].strip())
    bundle = Path(sys.argv[1])
    replays = bundle / "serving_steps.csv"
    if not replays.is_file():
        raise SystemExit(f"waiting_steps: {replays}: no calibration replays there")
    real = load([Path(p) for p in sys.argv[2:]])
    calibration = load([replays])
    mixed = real[(real["prompts"] > 0) & (real["prompt_tokens"] > 16)]
    matched = mixed[(mixed["decodes"] >= 3) & (mixed["decodes"] <= 8)]
    print(by_waiting(mixed, pd.cut(mixed["decodes"], [-1, 0, 2, 4, 8, 16, 32]),
                     "Steps with a prompt chunk over 16 tokens: mean body (ms) by decodes, by "
                     "requests waiting after scheduling"))  # fmt: skip
    print(by_waiting(matched, pd.cut(matched["received"], [-1, 20, 30, 40, 50, 70, 1000]),
                     "The same with 3-8 decodes, by requests received per second"))  # fmt: skip
    print(by_waiting(matched, pd.cut(matched["taken_in"], [-1, 20, 30, 40, 50, 70, 1000]),
                     "The same, by requests taken in (first scheduled) per second"))  # fmt: skip
    rows = [("calibration replays", calibration), ("judged servers", real)]
    print("| steps of | busy steps | with requests waiting | sigma (log) | lag-1 | lag-4 |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, frame in rows:
        s = spread(frame)
        share = float((frame["waiting"] > 0).mean())
        print(
            f"| {name} | {int(s['steps'])} | {share:.1%} | {s['sigma']:.3f} | "
            f"{s['autocorr_1']:.3f} | {s['autocorr_4']:.3f} |"
        )


if __name__ == "__main__":
    main()
