"""The sends' intake read against the rates' stretch without it: is one reading low?

The serving terms read what a send adds to its busy step (``intake_ms``, past the step's free
part ``intake_free_ms``: :mod:`gpu_simulate_test.calibration.intake_phase`) once, against the
rates' stretch fitted on the steps as they are, the sends' intake still in them. The intake
step's term was read the same way and came out low by the part the stretch carried back (20–37%
on fourteen calibrations, 2026-12-06: the steps taking a request in are predicted longer than
the others). This reads each calibration's intake again and again, each time against the stretch
refitted on the steps less the last reading per late send, until it settles, and prints the
first reading, the settled one and their ratio. Near 1, two-signed: one reading is not low.

Each SIM is a ``vidur_simulate`` run directory with the serving terms (its
``serving_residuals.csv``: the calibration replays' steps, their features and Vidur's
prediction, in the fit's order; its ``run_meta.json``: the bundle whose ``serving_steps.csv``
says which rate each replay ran at).

Run: ``python -m benchmarks.calibration.bench_intake_reading SIM [SIM ...] [--out F.json]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import intake_phase, serving_inputs, serving_load
from gpu_simulate_test.vidur_simulate.serving_report import SERVING_RESIDUALS

ROUNDS = 20
"""Readings at most, each against the stretch without the last."""
SETTLED_MS = 1e-4
"""Two readings this close (ms) have settled."""


def fit_inputs(sim_dir: Path) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, dict[str, Any]]:
    """A simulation's fit inputs: the replays' step features, Vidur's prediction of each, the
    rate each step's replay ran at, and the terms the simulation recorded."""
    meta = json.loads((sim_dir / "run_meta.json").read_text())
    serving = meta.get("serving_load") or {}
    bundle = (serving.get("calibrated_on") or {}).get("bundle")
    if not bundle:
        raise SystemExit(f"{sim_dir / 'run_meta.json'}: no serving_load.calibrated_on.bundle")
    # the offsets as text (a calibration without a two-send step would read as numbers)
    table = pd.read_csv(sim_dir / SERVING_RESIDUALS, dtype={intake_phase.CLIENT_SEND_OFFSETS: str})
    rates = serving_inputs.replay_rates(pd.read_csv(bundle))
    if len(rates) != len(table):
        raise SystemExit(
            f"{bundle}: {len(rates)} replay steps against {len(table)} rows in "
            f"{sim_dir / SERVING_RESIDUALS}: not the same calibration"
        )
    predicted = table["predicted_s"].to_numpy(dtype=float)
    features = table.drop(columns=["predicted_s", "modelled_s"])
    return features, predicted, rates, dict(serving.get("terms") or {})


def settled(seq: list[tuple[float, float]]) -> bool:
    """Whether the last two readings agree: the intake within :data:`SETTLED_MS`, the same free
    part."""
    return len(seq) > 1 and abs(seq[-1][0] - seq[-2][0]) < SETTLED_MS and seq[-1][1] == seq[-2][1]


def readings(
    features: pd.DataFrame, predicted: np.ndarray, rates: np.ndarray
) -> list[tuple[float, float]]:
    """The intake (ms) and free part (ms), read first as the fit reads it, then each time
    against the rates' stretch refitted on the steps less the last reading per late send, until
    two agree (:func:`settled`) or :data:`ROUNDS` readings. The stretch keeps the intake step's
    term (the fit takes it out after reading the intake): only the sends' intake is left out."""
    x = serving_inputs.fit_inputs(features, predicted, rates)  # what serving_load.fit reads

    def read(intake_s: float, free_ms: float) -> intake_phase.IntakePhase | None:
        load = serving_load.rated(x, x.body - intake_s * x.late(free_ms))
        if not load.rate_points:
            return None
        beyond = x.body - x.pred * serving_load.stretches(load, x.req)
        return intake_phase.fit(beyond, x.length_ms, x.busy, x.offsets, x.labels, x.sends)

    out: list[tuple[float, float]] = []
    phase = read(0.0, 0.0)
    while phase is not None and len(out) < ROUNDS:
        out.append((phase.intake_s * 1e3, phase.free_ms))
        if settled(out):
            break
        phase = read(phase.intake_s, phase.free_ms)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sims", nargs="+", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    print(
        "| simulation | recorded intake_ms @ free | read once | settled | settled / once | rounds |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for sim in args.sims:
        features, predicted, rates, terms = fit_inputs(sim)
        seq = readings(features, predicted, rates)
        if not seq:
            print(f"| {sim} | no intake read | | | | |")
            continue
        (once, free), (last, last_free) = seq[0], seq[-1]
        row = {
            "simulation": str(sim),
            "recorded_intake_ms": terms.get("intake_ms"),
            "recorded_free_ms": terms.get("intake_free_ms"),
            "once_ms": round(once, 4),
            "once_free_ms": free,
            "settled_ms": round(last, 4),
            "settled_free_ms": last_free,
            "ratio": round(last / once, 4) if once > 0 else None,
            "rounds": len(seq),
            "settled": settled(seq),
            "readings_ms": [[round(a, 4), f] for a, f in seq],
        }
        rows.append(row)
        shown = "n/a" if row["ratio"] is None else f"{row['ratio']:.3f}"
        shown += "" if row["settled"] else f" (not settled in {ROUNDS})"
        print(
            f"| {sim} | {terms.get('intake_ms', float('nan')):.3f} @ "
            f"{terms.get('intake_free_ms', float('nan')):.2f} | {once:.3f} @ {free:.2f} | "
            f"{last:.3f} @ {last_free:.2f} | {shown} | {len(seq)} |"
        )
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    summary = {}
    if ratios:
        summary = {
            "calibrations": len(ratios),
            "median_ratio": float(np.median(ratios)),
            "min_ratio": float(min(ratios)),
            "max_ratio": float(max(ratios)),
            "above_one": sum(r > 1 for r in ratios),
            "once_as_recorded": sum(
                r["recorded_intake_ms"] is not None
                and abs(r["once_ms"] - r["recorded_intake_ms"]) < 1e-3
                for r in rows
            ),
        }
        print(
            f"\nsettled / once over {len(ratios)} calibrations: "
            f"median {summary['median_ratio']:.3f}, "
            f"range {summary['min_ratio']:.3f}..{summary['max_ratio']:.3f}, "
            f"above 1 in {summary['above_one']}; the first reading is the simulation's recorded "
            f"term in {summary['once_as_recorded']} of {len(rows)} (else these inputs are not "
            "the fit's)"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    "date": dt.date.today().isoformat(),
                    "command": [
                        "python -m benchmarks.calibration.bench_intake_reading",
                        *sys.argv[1:],
                    ],
                    "rows": rows,
                    "summary": summary,
                },
                indent=1,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
