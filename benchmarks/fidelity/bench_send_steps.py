"""What a client's send adds to the engine step it falls in, on real runs (issue 64).

Each RUN is a real-bench run directory with the engine's own step record
(``engine_schedule.csv``) and the client's sends on the same clock (``request_metrics.csv``
``arrival_time_s``). Per run, over its busy decode-only steps: how many requests the client sent
while each ran, and the step's time beyond the median step of the same decode count with no send
(ms), for steps with one send and with two or more. A steady extra per send at every load is the
API server's intake on the engine's cores (``vidur.serving_intake``).

Run: ``python -m benchmarks.fidelity.bench_send_steps RUN_DIR [RUN_DIR ...]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.serving_load import step_features
from gpu_simulate_test.calibration.serving_replay import sends_within


def send_steps(run: Path) -> dict[str, float]:
    """One run's busy decode-only steps: their count, the share with a send, and the median
    extra (ms) of steps with one send and with two or more over those with none."""
    steps = pd.read_csv(run / "engine_schedule.csv")
    sent = np.sort(pd.read_csv(run / "request_metrics.csv")["arrival_time_s"].to_numpy(float))
    features = step_features(steps)
    sends = sends_within(sent, steps["start_time_s"].to_numpy(), steps["end_time_s"].to_numpy())
    decode = features["busy"].to_numpy() & (steps["num_prefill_requests"].to_numpy() == 0)
    frame = pd.DataFrame(
        {
            "decodes": steps["num_decode_requests"].to_numpy()[decode],
            "ms": features["body_s"].to_numpy()[decode] * 1e3,
            "sends": np.minimum(sends[decode], 2),
        }
    )
    base = frame[frame["sends"] == 0].groupby("decodes")["ms"].median()
    frame["extra"] = frame["ms"] - frame["decodes"].map(base)
    extra = frame.groupby("sends")["extra"].median()
    return {
        "steps": float(len(frame)),
        "with_send": float((frame["sends"] > 0).mean()) if len(frame) else float("nan"),
        "one": float(extra.get(1, np.nan)),
        "two_or_more": float(extra.get(2, np.nan)),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    print("| run | busy decode steps | with a send | extra ms: one send | two or more |")
    print("| --- | --- | --- | --- | --- |")
    ones = []
    for run in args.runs:
        row = send_steps(run)
        ones.append(row["one"])
        name = f"{run.parent.parent.parent.name}/{run.name}"
        print(
            f"| {name} | {row['steps']:.0f} | {row['with_send']:.0%} | {row['one']:+.2f} "
            f"| {row['two_or_more']:+.2f} |"
        )
    valid = np.asarray(ones, dtype=float)
    valid = valid[np.isfinite(valid)]
    if len(valid):
        print(
            f"one send: median {np.median(valid):+.2f} ms over {len(valid)} runs "
            f"(range {valid.min():+.2f}..{valid.max():+.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
