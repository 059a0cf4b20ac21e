"""How many GPUs, and how long the answer takes: the tune over replicas x the default engine
knobs (issue 62's target: at least 100 configurations simulated in at most 2 minutes locally).

Runs ``python -m gpu_simulate_test.cli.tune tune.verify=false`` with the default space (4 x 4 x
2 engine configurations) times ``tune.space.replicas`` (``--replicas``, 1,2,4,8) behind
``--routers`` (vllm_dp), ``--repeats`` times, the bundle reused (the first run profiles and
calibrates it when none is there: minutes, once, not counted), and prints per run the
configurations, the simulations (per fleet size) and the seconds the simulated search took
(``tune.json`` ``simulated_wall_s``), then the median and spread against the target; and the
frontier of GPUs against capacity of the last run.

Each repeat runs once per ``--workers`` value (``tune.workers``: 1, one process; 0, one per
core), alternating, and the last value is judged against the target; the speed-up is the
first's median over the last's.

Run: ``python -m benchmarks.speed.bench_tune_fleet [--replicas 1,2,4,8] [--routers vllm_dp]
[--repeats 2] [--workers 1,0] [--out F.json] [overrides]``.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

TARGET_S = 120.0
TARGET_CONFIGS = 100


def one_run(
    run_id: str, args: argparse.Namespace, workers: int, extra: list[str]
) -> dict[str, Any]:
    command = [
        sys.executable, "-m", "gpu_simulate_test.cli.tune", "tune.verify=false",
        f"tune.space.replicas=[{args.replicas}]", f"tune.space.router=[{args.routers}]",
        f"tune.workers={workers}", f"output.run_id={run_id}", "progress=false", *extra,
    ]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    run = Path("tmp") / "tune" / run_id
    doc = json.loads((run / "tune.json").read_text())
    with (run / "tune.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    per_fleet: Counter[str] = Counter()
    for row in rows:
        per_fleet[f"r{row['replicas']}"] += int(row["simulations"])
    return {
        "run_id": run_id,
        "workers": workers,
        "configurations": doc["configurations"],
        "simulations": doc["simulations"],
        "simulations_per_fleet": dict(sorted(per_fleet.items(), key=lambda kv: int(kv[0][1:]))),
        "simulated_wall_s": doc["simulated_wall_s"],
        "stage_wall_s": round(wall, 1),
        "gpu_frontier": doc["gpu_frontier"],
        "command": " ".join(command[1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--replicas", default="1,2,4,8")
    parser.add_argument("--routers", default="vllm_dp")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", default="1,0", help="tune.workers values, the last judged")
    parser.add_argument("--out", type=Path, default=None)
    args, extra = parser.parse_known_args()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    counts = [int(w) for w in args.workers.split(",")]
    runs = []
    for k in range(args.repeats):  # the worker counts alternate: one host moment each pair
        for workers in counts:
            result = one_run(f"bench-fleet-{stamp}-{k}-w{workers}", args, workers, extra)
            runs.append(result)
            print(
                f"run {k}, tune.workers={workers}: {result['configurations']} configurations, "
                f"{result['simulations']} simulations {result['simulations_per_fleet']} in "
                f"{result['simulated_wall_s']} s (the stage {result['stage_wall_s']} s)",
                flush=True,
            )
    configs = runs[0]["configurations"]
    medians: dict[int, float] = {}
    for workers in counts:
        seconds = [float(r["simulated_wall_s"]) for r in runs if r["workers"] == workers]
        medians[workers] = statistics.median(seconds)
        print(
            f"tune.workers={workers}: {configs} configurations simulated in "
            f"{medians[workers]:.1f} s median (min {min(seconds):.1f}, max {max(seconds):.1f} "
            f"over {len(seconds)})"
        )
    median = medians[counts[-1]]
    met = configs >= TARGET_CONFIGS and median <= TARGET_S
    if len(counts) > 1:
        base = medians[counts[0]]
        print(f"speed-up of tune.workers={counts[-1]} over {counts[0]}: {base / median:.2f}x")
    print(
        f"target >= {TARGET_CONFIGS} configurations in <= {TARGET_S:g} s (tune.workers="
        f"{counts[-1]}): {'met' if met else 'NOT met'}"
    )
    for row in runs[-1]["gpu_frontier"] or []:
        print(
            f"  {row['gpus']} GPU(s): {row['config_id']} {row['capacity_qps']} req/s "
            f"({row['capacity_per_gpu_qps']} per GPU)"
        )
    if args.out is not None:
        record = {
            "benchmark": "bench_tune_fleet",
            "date": dt.date.today().isoformat(),
            "machine": {"platform": platform.platform(), "python": platform.python_version(),
                        "cpus": os.cpu_count()},
            "runs": runs,
            "median_simulated_wall_s": {str(w): m for w, m in medians.items()},
            "target": {"configurations": TARGET_CONFIGS, "seconds": TARGET_S, "met": met},
        }  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
