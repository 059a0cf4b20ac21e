"""How each part of the client's first token moves with the host's speed (issue 64): the real
over the simulated time of each part, run by run, against the run's step level.

A fresh calibration and its truth run minutes apart, and the host moves between them: the truth's
steps ran 0.84-1.17x the calibration's over twenty main jobs. The simulation at the real run's
own step level scales what moves with it; which parts do? Per part of
:mod:`benchmarks.fidelity.bench_ttft_parts` (front end, held for a step, queued, to the first
token, the whole TTFT; the way in and the way back where it recorded them), over the runs: the
least-squares line of log(real mean / simulated mean) on log(level) (its slope, the
elasticity: 1, the part moves with the host as much as the steps do; 0, not at all), the
correlation, the spread of the log ratio before and after the line, and
the geometric mean of real over simulated. The level of each run is its stored
``bench_fresh_profiles`` record's ``step_level`` (the truth's busy steps over the model's).

Run: ``python -m benchmarks.fidelity.bench_level_parts --parts PARTS.json --jobs JOBS.json
[JOBS.json ...] [--out F.json]``, PARTS from ``bench_ttft_parts --out``, JOBS from
``bench_fresh_profiles --out``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.fidelity.bench_ttft_parts import PARTS as TTFT_PARTS
from benchmarks.fidelity.bench_ttft_parts import SIDES

PARTS = (*TTFT_PARTS, *SIDES)
"""Each part, and each way (the way in with the wait for a step, the way back) where the record
has it."""


def elasticity(levels: Sequence[float], real: Sequence[float], sim: Sequence[float]) -> dict:
    """The line of log(real / sim) on log(level) over the runs whose three are positive:
    ``slope``, ``correlation``, ``spread`` (the log ratio's sd) and ``left`` (its residuals'),
    ``mean_ratio`` (geometric mean of real / sim, less 1) and ``runs``; empty under three."""
    lv, r, s = (np.asarray(v, dtype=float) for v in (levels, real, sim))
    ok = (lv > 0) & (r > 0) & (s > 0)
    if int(ok.sum()) < 3:
        return {}
    x, y = np.log(lv[ok]), np.log(r[ok] / s[ok])
    slope, intercept = np.polyfit(x, y, 1)
    left = y - (intercept + slope * x)
    corr = float(np.corrcoef(x, y)[0, 1]) if x.std() > 0 and y.std() > 0 else float("nan")
    return {
        "slope": round(float(slope), 3),
        "correlation": round(corr, 3),
        "spread": round(float(y.std()), 4),
        "left": round(float(left.std()), 4),
        "mean_ratio": round(float(np.exp(y.mean()) - 1.0), 4),
        "runs": int(ok.sum()),
    }


def by_part(parts: Mapping[str, Any], levels: Mapping[str, float]) -> dict[str, dict]:
    """Each part's :func:`elasticity` over the runs in both ``parts`` (``bench_ttft_parts``'s
    record: per run, per part, ``real_mean_ms`` and ``sim_mean_ms``) and ``levels``."""
    runs = [run for run in parts if run in levels]
    out = {}
    for part in PARTS:
        have = [run for run in runs if part in parts[run]]
        out[part] = elasticity(
            [levels[run] for run in have],
            [parts[run][part]["real_mean_ms"] for run in have],
            [parts[run][part]["sim_mean_ms"] for run in have],
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=Path, required=True)
    parser.add_argument("--jobs", type=Path, nargs="+", required=True)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    parts = json.loads(args.parts.read_text())
    levels = {
        r["run"]: float(r["step_level"])
        for path in args.jobs
        for r in json.loads(path.read_text())["results"]
        if r.get("step_level") is not None
    }
    record = by_part(parts, levels)
    print("| part | elasticity to the level | correlation | spread of log(real / sim) | left "
          "after the level | geometric mean real / sim − 1 | runs |")  # fmt: skip
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for part, e in record.items():
        if e:
            print(f"| {part} | {e['slope']:.2f} | {e['correlation']:.2f} | {e['spread']:.3f} | "
                  f"{e['left']:.3f} | {100 * e['mean_ratio']:+.1f}% | {e['runs']} |")  # fmt: skip
    if args.out is not None:
        stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        payload = {"date": stamp, "command": " ".join(sys.argv), "by_part": record}
        args.out.write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
