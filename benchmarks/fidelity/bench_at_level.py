"""Stored main jobs simulated at their real run's own step level: how much of the main job's
error is the host's speed, how much the model's?

Each RUN is a pipeline run id (``tmp/pipeline/<RUN>``, e.g. from ``bench_fresh_profiles``). Its
real run's steps are timed with the step model of its own bundle (the ``vidur_profile`` path its
pipeline recorded), the same arrivals simulated again with every step that much longer
(:func:`~gpu_simulate_test.orchestrate.step_level.at_real_step_level`, as ``pipeline.at_level``
does since 2026-12-05), and set beside the simulation as calibrated, made again with the same
code (so that both columns are this checkout's model). Per run: the level, client TTFT p50 and
p90 as calibrated and at the level with the truth's repeat beside; then per figure how many runs
are within max(10%, real vs real), the mean signed error and its spread over the runs, both
ways; and each request's own front end (client less engine TTFT) over every run's requests
pooled, real against each simulation (where the engine runs on the host's CPU the level's
simulation scales its front end too, ``vidur.frontend_time_scale``). At the level is a
diagnosis (it reads the judged run), never the answer.

Run: ``python -m benchmarks.fidelity.bench_at_level RUN [RUN ...] [--set OVERRIDE ...]
[--tag NAME] [--out F.json]``: ``--set`` simulates both ways with a setting (e.g.
``vidur.intake_pause=true``), ``--tag`` names its runs apart (``atl-<tag>-<RUN>``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from benchmarks.fidelity.bench_fresh_profiles import fmt, judged
from benchmarks.fidelity.bench_sim_variants import pipeline_config, stored_run
from gpu_simulate_test.fidelity.bounds import LIMIT

FIGURES = ("p50", "p90")


def ttft_errors(compare_dir: Path | str) -> dict[str, dict[str, Any]]:
    """Client TTFT error and the truth's repeat per statistic of one comparison."""
    data = json.loads((Path(compare_dir) / "comparison.json").read_text())
    return {
        row["stat"]: {
            "error": row.get("error_vs_client"),
            "real_vs_real": row.get("noise_vs_client"),
        }
        for row in data["clocks"]
        if row["metric"] == "ttft"
    }


def front_end_ms(compare_dir: Path | str) -> dict[str, list[float]]:
    """A comparison's per-request front end (ms) on its real and its simulated side, over the
    requests both have (:mod:`gpu_simulate_test.compare.front_end`), in request order."""
    from gpu_simulate_test.compare import front_end

    config = json.loads((Path(compare_dir) / "run_meta.json").read_text())["config"]
    real = front_end.real_front_end_s(
        pd.read_csv(Path(config["real_run_dir"]) / "request_metrics.csv")
    )
    sim = front_end.sim_front_end_s(
        pd.read_csv(Path(config["sim_run_dir"]) / "request_metrics.csv")
    )
    ids = real.index.intersection(sim.index).sort_values()
    return {
        "real": [round(1e3 * float(v), 4) for v in real[ids]],
        "sim": [round(1e3 * float(v), 4) for v in sim[ids]],
    }


def pooled_front_end(results: list[dict[str, Any]]) -> list[str]:
    """Each way's per-request front end over every run's requests
    (:func:`gpu_simulate_test.compare.front_end.pooled`): real and simulated p50 / p90 / p99 and
    mean (ms), and the simulated over the real less 1."""
    from gpu_simulate_test.compare import front_end

    lines = []
    for way in ("as_calibrated", "at_level"):
        sides = [r.get("front_end_ms", {}).get(way) for r in results]
        runs = [  # each run's two lists over the same requests, in order (:func:`front_end_ms`)
            {side: pd.Series(np.asarray(s[side], dtype=float) / 1e3) for side in ("real", "sim")}
            for s in sides
            if s
        ]
        record = front_end.pooled(runs)
        if record is None:
            continue
        figures = ", ".join(
            f"{q} {record['real_ms'][q]:.2f} / {record['sim_ms'][q]:.2f} "
            f"({fmt(record['sim_vs_real'][q])})"
            for q in front_end.STATS
        )
        lines.append(
            f"each request's front end, {way.replace('_', ' ')}, {record['requests']} requests "
            f"pooled, real / simulated ms: {figures}"
        )
    return lines


def one(run: str, overrides: tuple[str, ...] = (), tag: str = "") -> dict[str, Any] | None:
    from gpu_simulate_test.orchestrate.step_level import at_real_step_level
    from gpu_simulate_test.orchestrate.steps import simulate_and_compare

    meta, scheduler, root = stored_run(run)  # the run's own bundle
    stages = meta["stages"]
    name = f"atl-{tag}-{run}" if tag else f"atl-{run}"
    cfg = pipeline_config(
        [
            f"profiling_root={root}",
            *overrides,
            f"output.run_id={name}",
            "output.overwrite=true",
            "progress=false",
        ]
    )
    workload, real = stages["workload"]["path"], stages["real_bench"]["path"]
    repeat = (stages.get("real_bench_repeat") or {}).get("path")
    _, as_is = simulate_and_compare(cfg, scheduler, workload, real, repeat_dir=repeat)
    level, at_dir = at_real_step_level(cfg, scheduler, workload, real, name)
    if level is None or at_dir is None:
        return None
    calibrated, at_level = ttft_errors(as_is), ttft_errors(at_dir)
    return {
        "run": run,
        "level": level["ratio"],
        "front_end_scaled": level.get("front_end"),
        "front_end_ms": {"as_calibrated": front_end_ms(as_is), "at_level": front_end_ms(at_dir)},
        "as_calibrated": calibrated,
        "at_level": {  # its comparison has no repeat: the truth's own beside it
            q: {**v, "real_vs_real": calibrated.get(q, {}).get("real_vs_real")}
            for q, v in at_level.items()
        },
    }


def report(results: list[dict[str, Any]]) -> None:
    print("| run | level | client TTFT p50: as calibrated / at the level (real vs real) | p90 |")
    print("| --- | --- | --- | --- |")
    for r in results:
        cells = [
            f"{fmt(r['as_calibrated'][q]['error'])} / {fmt(r['at_level'][q]['error'])} "
            f"({fmt(r['as_calibrated'][q]['real_vs_real'])})"
            for q in FIGURES
        ]
        print(f"| {r['run']} | {r['level']:.3f} | " + " | ".join(cells) + " |")
    levels = [r["level"] for r in results]
    if len(levels) > 1:
        print(
            f"levels: mean {statistics.mean(levels):.3f}, sd {statistics.stdev(levels):.3f}, "
            f"{min(levels):.3f}..{max(levels):.3f} over {len(levels)} runs"
        )
    for q in FIGURES:
        for way in ("as_calibrated", "at_level"):
            rows = [r[way][q] for r in results]
            within, count, mean = judged(rows)
            errors = [row["error"] for row in rows if row.get("error") is not None]
            sd = statistics.stdev(errors) if len(errors) > 1 else float("nan")
            print(
                f"client TTFT {q} {way.replace('_', ' ')}: within max({LIMIT:.0%}, real vs real) "
                f"in {within} of {count}; mean signed {fmt(mean)}, sd {sd:.1%}"
            )
    for line in pooled_front_end(results):
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    results = []
    for run in args.runs:
        done = one(run, tuple(args.overrides), args.tag)
        if done is None:
            print(f"{run}: no step level (no step record, or too few busy steps)", flush=True)
            continue
        results.append(done)
        print(f"{run}: level {done['level']:.3f}", flush=True)
    report(results)
    if args.out is not None:
        stamp = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        record = {"date": stamp, "command": " ".join(sys.argv), "results": results}
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
