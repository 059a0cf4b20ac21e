"""The same steps, timed by the calibration and by the servers judged later: no model between.

A simulated capacity off by more than the truth's own spread is either the model (a step of some
composition timed wrong) or the host (the calibration's moment ran at another speed than the
servers judged after it). The step level (``calibration/level.py``) answers through the step
model; this answers without it: the median time of busy decode-only steps with 1, 2, 4, 8, 16 and
32 decodes, in the bundle's idle-engine calibration (``engine_steps.csv``), in its calibration
replays under load (``serving_steps.csv``), and on every server a tune ran
(``runs/<config>/real_bench/*/engine_schedule.csv``), with the pause before each busy step.

Run: ``python -m benchmarks.calibration.step_speed <bundle dir> <tune run dir>
[<tune run dir> ...]``
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from gpu_simulate_test.calibration.serving_load import step_features

DECODES = (1, 2, 4, 8, 16, 32)
MIN_STEPS = 10


def decode_steps(schedule: pd.DataFrame) -> pd.DataFrame:
    """Busy decode-only steps of one replay: decodes, body and pause before (ms)."""
    schedule = schedule.reset_index(drop=True)
    features = step_features(schedule)
    busy = features["busy"].to_numpy(dtype=bool)
    decode_only = busy & (schedule["num_prefill_requests"].to_numpy(dtype=int) == 0)
    return pd.DataFrame(
        {
            "decodes": schedule["num_decode_requests"].to_numpy(dtype=int)[decode_only],
            "body_ms": features["body_s"].to_numpy(dtype=float)[decode_only] * 1e3,
            "gap_ms": features["gap_s"].to_numpy(dtype=float)[decode_only] * 1e3,
        }
    )


def cells(steps: pd.DataFrame) -> list[str]:
    out = []
    for k in DECODES:
        mine = steps[steps["decodes"] == k]
        if len(mine) < MIN_STEPS:
            out.append("–")
        else:
            body, gap = mine["body_ms"].median(), mine["gap_ms"].median()
            out.append(f"{body:.2f} / {gap:.2f} ({len(mine)})")
    return out


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.strip().splitlines()[-1])
        return 2
    bundle, runs = Path(argv[0]), [Path(a) for a in argv[1:]]
    header = "| steps of | " + " | ".join(f"{k} decodes" for k in DECODES) + " |"
    print("median body / pause before, ms (steps)\n")
    print(header)
    print("| --- " * (len(DECODES) + 1) + "|")
    idle = pd.read_csv(bundle / "engine_steps.csv")
    idle = idle[idle["phase"] == "decode"]
    idle_cells = []
    for k in DECODES:
        row = idle[idle["batch_size"] == k]
        idle_cells.append(f"{row['step_ms'].iloc[0]:.2f}" if len(row) else "–")
    print("| calibration, idle engine | " + " | ".join(idle_cells) + " |")
    serving = pd.read_csv(bundle / "serving_steps.csv")
    replays = [decode_steps(part) for _, part in serving.groupby("replay", sort=False)]
    print("| calibration replays | " + " | ".join(cells(pd.concat(replays))) + " |")
    for run in runs:
        for config in sorted(p for p in (run / "runs").iterdir() if p.is_dir()):
            schedules = sorted(config.glob("real_bench/*/engine_schedule.csv"))
            if not schedules:
                continue
            steps = pd.concat([decode_steps(pd.read_csv(p)) for p in schedules])
            print(f"| {run.name}: {config.name} | " + " | ".join(cells(steps)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
