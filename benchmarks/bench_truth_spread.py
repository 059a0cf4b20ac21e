"""The truth against itself: how often does one real run land within ±10% of another?

Issue 28 asks that every fresh profile's simulation put TTFT, TPOT and E2E p50 within ±10% of
the real run, five times in five. This benchmark asks the same of the truth alone. It runs the
real bench of ``make run``'s job (tiny Qwen3 on CPU against a vLLM server it starts, the
pipeline's workload: 40 requests at 4 req/s, prompts 16-128, outputs 4-32) ``--runs`` times back
to back, one server each, and prints per clock (the engine's own and the client's):

- each run's p50s, and over the runs each metric's coefficient of variation and max / min;
- **one run against another**: over every ordered pair, how often all three p50s of the one are
  within ``--limit`` of the other's, and that fraction to the fifth power (five in a row, were
  the runs independent);
- **the best single prediction**: the most runs that one fixed set of p50s, chosen knowing
  every run, puts within ``--limit`` on all three at once. No simulation can do better against
  these runs.

A simulation judged against one real run cannot be checked more finely than the real runs
agree with each other.

Run: ``python -m benchmarks.bench_truth_spread [--runs 10] [--limit 0.1] [--out F.json]
[overrides...]``, or ``--from tmp/real_bench/A tmp/real_bench/B ...`` to read runs made before;
``--fidelity A/fidelity.csv B/fidelity.csv ...`` asks issue 28's other bound, the mean signed
error over a campaign's rows within ±3%, of each campaign's simulation and of its truth's repeat
(the ``noise`` column: the real side run twice).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import OmegaConf

from gpu_simulate_test.config.registry import CONFIG_DIR

CLOCKS = {  # summary.json's p50s, per clock
    "engine": ("engine_ttft_ms", "engine_tpot_ms", "engine_e2e_ms"),
    "client": ("p50_ttft_ms", "p50_tpot_ms", "p50_e2el_ms"),
}


def pipeline_workload() -> list[str]:
    """``make run``'s own workload (``configs/pipeline.yaml``'s ``workload`` block) as overrides
    of the workload stage, so that the two cannot drift apart."""
    pipeline = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "pipeline.yaml"))
    assert isinstance(pipeline, dict)

    def flat(prefix: str, value: Any) -> list[str]:
        if isinstance(value, dict):
            return [o for k, v in value.items() for o in flat(f"{prefix}.{k}", v)]
        return [f"{prefix}={value}"]

    return flat("workload", pipeline["workload"])


def p50s(run_dir: Path) -> dict[str, list[float]]:
    """The run's TTFT, TPOT and E2E p50 (ms) per clock, from its ``summary.json``."""
    summary = json.loads((run_dir / "summary.json").read_text())
    out: dict[str, list[float]] = {}
    for clock, keys in CLOCKS.items():
        values = [summary.get(k) for k in keys]
        values = [v["p50"] if isinstance(v, dict) else v for v in values]
        if all(isinstance(v, (int, float)) for v in values):
            out[clock] = [float(v) for v in values]
    return out


def pairs_within(values: np.ndarray, limit: float) -> tuple[int, int]:
    """Ordered pairs (i, j), i ≠ j, whose every column has ``|v_i / v_j - 1| ≤ limit``, and the
    number of pairs. ``values``: runs × metrics."""
    n = len(values)
    hits = sum(
        bool(np.all(np.abs(values[i] / values[j] - 1.0) <= limit + 1e-12))
        for i, j in itertools.permutations(range(n), 2)
    )
    return hits, n * (n - 1)


def best_prediction(values: np.ndarray, limit: float) -> tuple[int, list[float]]:
    """The most runs one fixed prediction puts within ``limit`` on every column at once, and that
    prediction. Run j is met on column k by any ``p`` in ``[v_jk (1 - limit), v_jk (1 + limit)]``
    (relative to the run), so the best ``p`` of each column is one of those ends."""
    lows, highs = values * (1.0 - limit), values * (1.0 + limit)
    columns = range(values.shape[1])
    candidates = [np.unique(np.concatenate([lows[:, k], highs[:, k]])) for k in columns]
    best, where = 0, [float(np.median(values[:, k])) for k in columns]
    for point in itertools.product(*candidates):
        p = np.asarray(point)
        met = int(np.sum(np.all(np.abs(p / values - 1.0) <= limit + 1e-12, axis=1)))
        if met > best:
            best, where = met, [float(x) for x in p]
    return best, where


def spread(values: np.ndarray, limit: float) -> dict[str, Any]:
    """Every figure this benchmark prints for one clock's runs × (TTFT, TPOT, E2E) p50s."""
    hits, pairs = pairs_within(values, limit)
    met, prediction = best_prediction(values, limit)
    fraction = hits / pairs if pairs else float("nan")
    return {
        "runs": len(values),
        "cv": [round(float(c), 4) for c in values.std(axis=0, ddof=1) / values.mean(axis=0)],
        "max_over_min": [round(float(r), 3) for r in values.max(axis=0) / values.min(axis=0)],
        "pairs_within": hits,
        "pairs": pairs,
        "pair_fraction": round(fraction, 4),
        "five_in_a_row": round(fraction**5, 4),
        "best_prediction_meets": met,
        "best_prediction_ms": [round(v, 3) for v in prediction],
    }


def fidelity_table(path: Path) -> pd.DataFrame:
    """A fidelity table with the columns :func:`campaign_bias` reads, or a one-line exit."""
    table = pd.read_csv(path)
    missing = {"clock", "rel_error", "noise"} - set(table.columns)
    if missing:
        raise SystemExit(
            f"{path}: not a fidelity table of the stage's current layout (missing columns "
            f"{', '.join(sorted(missing))})"
        )
    return table


def campaign_bias(table: pd.DataFrame) -> dict[str, dict[str, float | int | None]]:
    """Per backend and clock of a fidelity table (``fidelity.csv``; ``<backend>/<clock>``): the
    mean signed error, in %, of the simulation and of the truth's own repeat (the ``noise``
    column), both over the rows that had a repeat, and how many rows that was. Without a repeat,
    the simulation's over every row and the repeat's None."""
    out: dict[str, dict[str, float | int | None]] = {}
    keys = ["backend", "clock"] if "backend" in table.columns else ["clock"]
    for key, rows in table.groupby(keys):
        name = "/".join(str(k) for k in key)
        repeated = rows[rows["noise"].notna()]
        judged = repeated if len(repeated) else rows
        out[name] = {
            "rows": len(judged),
            "sim_mean_signed_pct": round(float(judged["rel_error"].mean()) * 100, 2),
            "repeat_rows": len(repeated),
            "repeat_mean_signed_pct": (
                round(float(repeated["noise"].mean()) * 100, 2) if len(repeated) else None
            ),
        }
    return out


def print_bias(tables: dict[str, dict[str, dict[str, float | int | None]]], limit: float) -> None:
    """Issue 28's bias bound (mean signed within ``limit``) asked of each campaign's simulation
    and of its truth's repeat."""
    print("\n| campaign | backend/clock | rows | simulation mean signed | repeat mean signed |")
    print("| --- | --- | --- | --- | --- |")
    met = {"sim": 0, "repeat": 0, "campaigns": 0}
    for name, clocks in tables.items():
        for clock, f in clocks.items():
            repeat, sim = f["repeat_mean_signed_pct"], float(f["sim_mean_signed_pct"] or 0.0)
            print(
                f"| {name} | {clock} | {f['rows']} | {sim:+.1f}% | "
                + ("–" if repeat is None else f"{repeat:+.1f}%")
                + " |"
            )
            if repeat is not None:
                met["campaigns"] += 1
                met["sim"] += abs(sim) <= limit * 100
                met["repeat"] += abs(repeat) <= limit * 100
    print(
        f"\nmean signed within ±{limit:.0%}, over {met['campaigns']} campaign-clocks with a "
        f"repeat: the simulation {met['sim']}, the truth's repeat {met['repeat']}"
    )


def run_one(run_id: str, workload_dir: Path, overrides: list[str]) -> Path:
    cmd = [
        sys.executable, "-m", "gpu_simulate_test.cli.real_bench", "backend=vllm",
        f"workload_dir={workload_dir}", f"output.run_id={run_id}", "progress=false", *overrides,
    ]  # fmt: skip
    print("$ " + " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return Path("tmp") / "real_bench" / run_id


def make_workload(run_id: str) -> Path:
    cmd = [
        sys.executable, "-m", "gpu_simulate_test.cli.workload", f"output.run_id={run_id}",
        *pipeline_workload(),
    ]  # fmt: skip
    print("$ " + " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return Path("tmp") / "workload" / run_id


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--limit", type=float, default=0.10)
    parser.add_argument("--bias-limit", type=float, default=0.03)  # issue 28: mean signed ±3%
    parser.add_argument("--from", dest="dirs", nargs="*", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--fidelity", nargs="*", type=Path, default=None,
                        help="fidelity.csv files: the bias bound asked of each campaign's "
                        "simulation and of its truth's repeat")  # fmt: skip
    args, overrides = parser.parse_known_args()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    if args.fidelity:
        tables = {str(f): campaign_bias(fidelity_table(f)) for f in args.fidelity}
        print_bias(tables, args.bias_limit)
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            command = " ".join(["python -m benchmarks.bench_truth_spread", *sys.argv[1:]])
            args.out.write_text(json.dumps({"command": command, "campaigns": tables}, indent=1))
        return
    if args.dirs:
        dirs = list(args.dirs)
    else:
        workload = make_workload(f"spread-{stamp}")
        dirs = [run_one(f"spread-{stamp}-{i}", workload, overrides) for i in range(args.runs)]
    runs = {str(d): p50s(d) for d in dirs}
    marks = {str(d): marked(d) for d in dirs}
    figures: dict[str, Any] = {}
    for clock in CLOCKS:
        rows = [r[clock] for r in runs.values() if clock in r]
        if len(rows) < 2:
            continue
        figures[clock] = spread(np.asarray(rows), args.limit)
    print_report(runs, marks, figures, args.limit)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        command = " ".join(["python -m benchmarks.bench_truth_spread", *sys.argv[1:]])
        doc = {"command": command, "date": stamp, "limit": args.limit, "runs": runs, "marks": marks}
        args.out.write_text(json.dumps({**doc, "figures": figures}, indent=1))


def marked(run_dir: Path) -> dict[str, Any]:
    """The run's disturbance verdict and its host-memory readings (ms, before / after)."""
    summary = json.loads((run_dir / "summary.json").read_text())
    meta = json.loads((run_dir / "run_meta.json").read_text())
    probe = meta.get("host_probe") or {}
    return {
        "disturbed": bool((summary.get("disturbance") or {}).get("disturbed")),
        "host_probe_ms": [(probe.get(k) or {}).get("ms") for k in ("before", "after")],
    }


def print_report(
    runs: dict[str, dict[str, list[float]]],
    marks: dict[str, dict[str, Any]],
    figures: dict[str, Any],
    limit: float,
) -> None:
    print(
        "\n| run | engine TTFT / TPOT / E2E p50 (ms) | client TTFT / TPOT / E2E p50 (ms) "
        "| disturbed | host memory before / after (ms) |"
    )
    print("| --- | --- | --- | --- | --- |")
    for name, r in runs.items():
        cells = [" / ".join(f"{v:.2f}" for v in r.get(c, [])) or "–" for c in CLOCKS]
        mark = marks.get(name) or {}
        probe = " / ".join(f"{v:.2f}" if v else "–" for v in mark.get("host_probe_ms", []))
        print(
            f"| {Path(name).name} | {cells[0]} | {cells[1]} | "
            f"{'yes' if mark.get('disturbed') else 'no'} | {probe or '–'} |"
        )
    pct = f"±{limit:.0%}"
    for clock, f in figures.items():
        print(
            f"\n{clock} clock, {f['runs']} runs: CV (TTFT, TPOT, E2E) "
            f"{', '.join(f'{c:.1%}' for c in f['cv'])}; max / min "
            f"{', '.join(f'{r:.2f}' for r in f['max_over_min'])}"
        )
        print(
            f"  one run against another, every p50 within {pct}: {f['pairs_within']} of "
            f"{f['pairs']} pairs ({f['pair_fraction']:.0%}); five in a row ≈ "
            f"{f['five_in_a_row']:.2%}"
        )
        print(
            f"  the best single prediction (chosen knowing every run) meets {pct} on every p50 "
            f"in {f['best_prediction_meets']} of {f['runs']} runs"
        )


if __name__ == "__main__":
    main()
