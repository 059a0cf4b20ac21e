"""Stored main jobs: the step level of the truth, of its repeat and of the calibration's own
validation replay, each against the run's step model. Do the truth and its repeat (one server,
minutes apart) share a level the calibration missed, and does the validation replay, run right
after the calibration on the same server with another seed, see it coming?

Each RUN is a pipeline run id (``tmp/pipeline/<RUN>``, e.g. from ``bench_fresh_profiles``). Each
real run's steps are timed with the step model of the run's own bundle, as ``pipeline.at_level``
times the truth's (:func:`~gpu_simulate_test.orchestrate.step_level.real_step_level`): measured
over modelled. Per run the three levels; then their correlations and the spread of the truth's
level left after dividing it by the validation replay's to a power (0: as calibrated, 1: the
validation's level taken whole), a diagnosis of whether re-levelling on the validation replay
would narrow the main job's error as calibrated.

Run: ``python -m benchmarks.fidelity.bench_levels RUN [RUN ...] [--out F.json]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.fidelity.bench_sim_variants import pipeline_config, stored_run

SIDES = ("truth", "repeat", "validation")
POWERS = (0.0, 0.25, 0.5, 0.75, 1.0)


def levels(run: str, model_root: Path) -> dict[str, Any]:
    """One stored run's three levels (None where a run or its level is missing)."""
    from gpu_simulate_test.orchestrate.step_level import real_step_level

    meta, scheduler, root = stored_run(run)
    stages = meta["stages"]
    cfg = pipeline_config([f"profiling_root={root}", "progress=false"])
    checks = meta.get("calibration_check") or []
    check = (checks[-1].get("runs") or {}) if checks else {}
    where = {
        "truth": (stages["workload"]["path"], stages["real_bench"]["path"]),
        "repeat": (stages["workload"]["path"], (stages.get("real_bench_repeat") or {}).get("path")),
        "validation": (check.get("workload"), check.get("real")),
    }
    out: dict[str, Any] = {"run": run}
    for side, (workload, real) in where.items():
        level = None
        if workload and real and Path(real).is_dir():
            level = real_step_level(cfg, scheduler, workload, real, model_root / run / side)
        out[side] = None if level is None else level["ratio"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as models:
        results = [levels(run, Path(models)) for run in args.runs]
    print("| run | truth | repeat | validation |\n| --- | --- | --- | --- |")
    for r in results:
        cells = [f"{r[s]:.3f}" if r[s] is not None else "–" for s in SIDES]
        print(f"| {r['run']} | " + " | ".join(cells) + " |")
    whole = [r for r in results if all(r[s] is not None for s in SIDES)]
    if len(whole) >= 3:
        t, rep, v = (np.log([r[s] for r in whole]) for s in SIDES)
        print(
            f"\n{len(whole)} runs; correlation of the log levels: truth-repeat "
            f"{np.corrcoef(t, rep)[0, 1]:.2f}, truth-validation {np.corrcoef(t, v)[0, 1]:.2f}, "
            f"repeat-validation {np.corrcoef(rep, v)[0, 1]:.2f}; the repeat over the truth: sd "
            f"{np.std(rep - t):.1%}"
        )
        for a in POWERS:
            left = t - a * v
            print(
                f"  the truth's level over the validation's to the power {a:g}: sd "
                f"{np.std(left):.1%}, mean {np.mean(left):+.1%} (log)"
            )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "command": " ".join(
                        ["python -m benchmarks.fidelity.bench_levels", *sys.argv[1:]]
                    ),
                    "date": dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S"),
                    "results": results,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
