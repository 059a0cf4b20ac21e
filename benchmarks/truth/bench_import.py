"""Bring your own truth, checked: ``vllm bench serve`` and our client on one vLLM server, the
same workload, and is the imported run as close to ours as our own repeats are to each other?

Per round, on one server (the ``vllm`` backend's knobs, tiny Qwen3, 127.0.0.1):

1. ``vllm bench serve --save-result --save-detailed`` (random prompts, Poisson at ``--qps``);
2. its result imported (``bench_import``): a workload run (its lengths and send times) and a
   real_bench run (its TTFT, TPOT, E2E);
3. our client (``real_bench backend=vllm``) replays that very workload twice, once before
   ``vllm bench serve`` and once after it (the host drifts over minutes: the imported run is
   bracketed by ours in time).

Printed per metric (TTFT, TPOT, E2E at p50 and p90), per round: the imported figure, our two, the
spread of our two |a − b| / mean(a, b), and the imported run's gap to their mean; then over every
round, the target: is each imported figure within the spread of all our repeats (between the
lowest and the highest of our runs)? Beside it, the median pairwise difference of our runs (real
vs real) and of imported vs ours, the same statistic for both.

``vllm bench serve`` 0.32 no longer asks for greedy sampling: without ``--temperature`` the server
samples at its default (temperature 1 over Qwen3's whole 151,936-token vocabulary), work per
request per step our client's greedy requests never ask for. ``--temperature 0`` (the default
here) makes both clients ask for the same engine work; ``--temperature server`` leaves it out.

Run: ``python -m benchmarks.truth.bench_import [--requests N] [--qps Q] [--rounds R]
[--temperature T] [--out F.json]``, alone on the machine (it times a server). Needs vLLM
(``make setup``).
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

from benchmarks.truth.bench_real_bench import _compose
from benchmarks.truth.bench_vllm_client import VLLM_BENCH
from benchmarks.truth.served import Served, served_vllm
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


def _import(root: Path, result: Path, run_id: str) -> None:
    cfg = to_typed(
        _compose(
            "bench_import",
            [
                f"source={result}",
                f"output.root={root}",
                f"output.run_id={run_id}",
                "progress=false",
            ],
        ),
        BenchImportStageConfig,
    )
    import_run(cfg, {"bench": run_id})


def pooled(rounds: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per figure over every round: the range of all our runs, whether each imported figure lies
    in it, and the median pairwise relative difference of our runs and of imported vs ours."""
    out = {}
    for key in rounds[0]:
        ours = [rounds[0][key]["ours_a"]] + [r[key]["ours_b"] for r in rounds]  # a = last b
        theirs = [r[key]["theirs"] for r in rounds]
        lo, hi = min(ours), max(ours)
        rel = [abs(a - b) / ((a + b) / 2) for j, a in enumerate(ours) for b in ours[j + 1 :]]
        cross = [abs(t - o) / ((t + o) / 2) for t in theirs for o in ours]
        out[key] = {
            "ours_min": lo,
            "ours_max": hi,
            "spread": (hi - lo) / statistics.mean(ours),
            "theirs": theirs,
            "within": sum(lo <= t <= hi for t in theirs),
            "real_vs_real_median": statistics.median(rel),
            "imported_vs_ours_median": statistics.median(cross),
        }
    return out


def ours_run(served: Served, workload: Path, run_id: str) -> dict[str, float]:
    bench = to_typed(
        _compose(
            "real_bench",
            [*served.overrides, f"workload_dir={workload}", f"output.run_id={run_id}"],
        ),
        RealBenchStageConfig,
    )
    return figures(bench_run(bench, {"bench": run_id}))


def one_round(
    served: Served, root: Path, args: argparse.Namespace, i: int, before: dict[str, float]
) -> tuple[dict[str, Any], dict[str, float]]:
    """``vllm bench serve`` once (the same seed every round: the same prompts and send times),
    imported, with our run before it (``before``, the previous round's after) and after it on
    the very workload it sent: the imported run is bracketed by ours in time."""
    result = root / f"vllm-bench-{i}.json"
    vllm_bench(served, args, result, seed=args.seed)
    _import(root, result, f"theirs-{i}")
    theirs = figures(root / "real_bench" / f"theirs-{i}")
    after = ours_run(served, root / "workload" / f"theirs-{i}", f"ours-{i + 1}")
    rows = {}
    for key in theirs:
        a, b = before[key], after[key]
        mean = (a + b) / 2
        rows[key] = {
            "theirs": theirs[key],
            "ours_a": a,
            "ours_b": b,
            "spread": abs(a - b) / mean,
            "gap": abs(theirs[key] - mean) / mean,
        }
        rows[key]["within"] = rows[key]["gap"] <= rows[key]["spread"]
    return rows, after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--qps", type=float, default=4.0)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--output", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="vllm bench serve's --seed")
    parser.add_argument(
        "--temperature", default="0", help="vllm bench serve's --temperature, or 'server'"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-import-"))
    rounds = []
    with served_vllm(root) as served:
        # a warm-up run of theirs gives the workload of our first run
        vllm_bench(served, args, root / "vllm-bench-warmup.json", seed=args.seed)
        _import(root, root / "vllm-bench-warmup.json", "warmup")
        before = ours_run(served, root / "workload" / "warmup", "ours-0")
        for i in range(args.rounds):
            rows, before = one_round(served, root, args, i, before)
            rounds.append(rows)
            print(f"\nround {i}: {'metric':<14}{'imported':>10}{'ours a':>10}{'ours b':>10}"
                  f"{'spread':>9}{'gap':>9}  within")  # fmt: skip
            for key, r in rows.items():
                print(
                    f"{'':<9}{key:<14}{r['theirs']:>10.2f}{r['ours_a']:>10.2f}{r['ours_b']:>10.2f}"
                    f"{r['spread']:>9.1%}{r['gap']:>9.1%}  {'yes' if r['within'] else 'NO'}"
                )
    keys = list(rounds[0])
    within_pair = sum(r[k]["within"] for r in rounds for k in keys)
    print(f"\nper round, imported within its two neighbours' spread: {within_pair} of "
          f"{len(keys) * len(rounds)} figures")  # fmt: skip
    pool = pooled(rounds)
    print(f"\nover every round ({len(rounds) + 1} runs of ours, {len(rounds)} imported):")
    print(f"{'metric':<14}{'ours min':>10}{'ours max':>10}{'spread':>9}  imported"
          f"{'':<22}within  real-vs-real / imported-vs-ours median")  # fmt: skip
    for key, r in pool.items():
        imported = " ".join(f"{t:.2f}" for t in r["theirs"])
        print(
            f"{key:<14}{r['ours_min']:>10.2f}{r['ours_max']:>10.2f}{r['spread']:>9.1%}  "
            f"{imported:<30}{r['within']}/{len(r['theirs'])}  "
            f"{r['real_vs_real_median']:.1%} / {r['imported_vs_ours_median']:.1%}"
        )
    within = sum(r["within"] for r in pool.values())
    print(f"imported within the spread of all our repeats: {within} of {len(keys) * len(rounds)}")
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
                    "seed": args.seed,
                    "rounds": rounds,
                    "within_neighbours": within_pair,
                    "pooled": pool,
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
