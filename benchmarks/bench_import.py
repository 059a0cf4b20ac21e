"""Bring your own truth, checked: ``vllm bench serve`` and our client on one vLLM server, the
same workload, and is the imported run as close to ours as our own repeats are to each other?

Per round, on one server (the ``vllm`` backend's knobs, tiny Qwen3, 127.0.0.1):

1. ``vllm bench serve --save-result --save-detailed`` (random prompts, Poisson at ``--qps``);
2. its result imported (``bench_import``): a workload run (its lengths and send times) and a
   real_bench run (its TTFT, TPOT, E2E);
3. our client (``real_bench backend=vllm``) replays that very workload twice.

Printed per metric (TTFT, TPOT, E2E at p50 and p90): the imported figure, our two, the spread of
our repeats |a − b| / mean(a, b), and the imported run's gap to our mean |theirs − mean| /
mean; the target is gap ≤ spread (the imported truth within the real-vs-real spread).

``vllm bench serve`` 0.32 no longer asks for greedy sampling: without ``--temperature`` the server
samples at its default (temperature 1 over Qwen3's whole 151,936-token vocabulary), work per
request per step our client's greedy requests never ask for. ``--temperature 0`` (the default
here) makes both clients ask for the same engine work; ``--temperature server`` leaves it out.

Run: ``python -m benchmarks.bench_import [--requests N] [--qps Q] [--rounds R] [--temperature T]
[--out F.json]``, alone on the machine (it times a server). Needs vLLM (``make setup``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_real_bench import _compose
from benchmarks.bench_vllm_client import VLLM_BENCH
from benchmarks.served import Served, served_vllm
from gpu_simulate_test.bench_import.stage import run as import_run
from gpu_simulate_test.config.bench_import import BenchImportStageConfig
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv
from gpu_simulate_test.io.schemas import REQUEST_METRICS
from gpu_simulate_test.real_bench.stage import run as bench_run

METRICS = ("ttft", "tpot", "e2e")
QUANTILES = (50, 90)


def figures(real_dir: Path) -> dict[str, float]:
    """p50 and p90 of TTFT, TPOT, E2E (ms) of a real_bench run's successful requests."""
    table = read_csv(real_dir / layout.REQUEST_METRICS, REQUEST_METRICS)
    table = table[table["status"] == "ok"]
    out = {}
    for m in METRICS:
        values = table[f"{m}_s"].dropna().to_numpy(dtype=float) * 1e3
        for q in QUANTILES:
            out[f"p{q}_{m}_ms"] = float(np.percentile(values, q))
    return out


def vllm_bench(served: Served, args: argparse.Namespace, result: Path, seed: int) -> None:
    cmd = [
        sys.executable, "-c", VLLM_BENCH, "--backend", "vllm", "--base-url", served.base_url,
        "--endpoint", "/v1/completions", "--model", "qwen3_tiny", "--tokenizer",
        str(served.model_dir), "--dataset-name", "random", "--random-input-len", str(args.prompt),
        "--random-output-len", str(args.output), "--random-range-ratio", "0", "--num-prompts",
        str(args.requests), "--request-rate", str(args.qps), "--ignore-eos", "--seed", str(seed),
        "--save-result", "--save-detailed", "--result-dir", str(result.parent),
        "--result-filename", result.name,
    ]  # fmt: skip
    if args.temperature != "server":
        cmd += ["--temperature", args.temperature]
    cpus = served.client_cpus
    subprocess.run(
        cmd,
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )


def one_round(served: Served, root: Path, args: argparse.Namespace, i: int) -> dict[str, Any]:
    result = root / f"vllm-bench-{i}.json"
    vllm_bench(served, args, result, seed=i)
    cfg = to_typed(
        _compose(
            "bench_import",
            [
                f"source={result}",
                f"output.root={root}",
                f"output.run_id=theirs-{i}",
                "progress=false",
            ],
        ),
        BenchImportStageConfig,
    )
    import_run(cfg, {"bench": f"theirs-{i}"})
    workload = root / "workload" / f"theirs-{i}"
    theirs = figures(root / "real_bench" / f"theirs-{i}")
    ours = []
    for rep in ("a", "b"):
        bench = to_typed(
            _compose(
                "real_bench",
                [*served.overrides, f"workload_dir={workload}", f"output.run_id=ours-{i}{rep}"],
            ),
            RealBenchStageConfig,
        )
        ours.append(figures(bench_run(bench, {"bench": f"ours-{i}{rep}"})))
    rows = {}
    for key in theirs:
        a, b = ours[0][key], ours[1][key]
        mean = (a + b) / 2
        rows[key] = {
            "theirs": theirs[key],
            "ours_a": a,
            "ours_b": b,
            "spread": abs(a - b) / mean,
            "gap": abs(theirs[key] - mean) / mean,
        }
        rows[key]["within"] = rows[key]["gap"] <= rows[key]["spread"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--qps", type=float, default=4.0)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--output", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--temperature", default="0", help="vllm bench serve's --temperature, or 'server'"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-import-"))
    rounds = []
    with served_vllm(root) as served:
        for i in range(args.rounds):
            rows = one_round(served, root, args, i)
            rounds.append(rows)
            print(f"\nround {i}: {'metric':<14}{'imported':>10}{'ours a':>10}{'ours b':>10}"
                  f"{'spread':>9}{'gap':>9}  within")  # fmt: skip
            for key, r in rows.items():
                print(
                    f"{'':<9}{key:<14}{r['theirs']:>10.2f}{r['ours_a']:>10.2f}{r['ours_b']:>10.2f}"
                    f"{r['spread']:>9.1%}{r['gap']:>9.1%}  {'yes' if r['within'] else 'NO'}"
                )
    keys = list(rounds[0])
    within = sum(r[k]["within"] for r in rounds for k in keys)
    print(f"\nimported within our repeats' spread: {within} of {len(keys) * len(rounds)} figures")
    print("median gap " + ", ".join(
        f"{k} {statistics.median(r[k]['gap'] for r in rounds):.1%}" for k in keys
    ))  # fmt: skip
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "vllm_version": served.vllm_version,
                    "date": time.strftime("%Y-%m-%d"),
                    "host_cpus": os.cpu_count(),
                    "client_cpus": sorted(served.client_cpus) if served.client_cpus else None,
                    "requests": args.requests,
                    "qps": args.qps,
                    "prompt_tokens": args.prompt,
                    "output_tokens": args.output,
                    "vllm_bench_temperature": args.temperature,
                    "rounds": rounds,
                    "within": within,
                    "figures": len(keys) * len(rounds),
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
