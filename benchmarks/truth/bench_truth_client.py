"""Is the truth disturbed by its own client? The two clients of the real bench on one vLLM server.

One vLLM server (the pipeline's served engine: tiny Qwen3 on CPU, the pipeline's knobs) serves,
in turns, the real bench with ``backend.client=threads`` (one thread per request in flight) and
``backend.client=asyncio`` (one event loop for every stream), on two shapes:

- **default**: the main job's workload (Poisson arrivals, the pipeline's lengths and rate);
- **bursty**: gamma arrivals with burstiness 0.25, short prompts and outputs (the shape whose
  late sends and held-back streams issue 26 measured).

Per run it prints the disturbance signs the real bench records (arrival error p99, the share of
held-back token gaps, foreign CPU), the CPU of the client, the API server and the engine, how long
the client's threads waited for a CPU while ready to run (``/proc`` schedstat), and the client's
TTFT p50. Rounds alternate which client goes first, so a drift of the host hits both.

Run: ``python -m benchmarks.truth.bench_truth_client [--rounds R] [--requests N]
[--out FILE.json]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.truth.bench_real_bench import _compose
from gpu_simulate_test.config.backends import VllmBackendConfig, as_engine
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ArrivalConfig
from gpu_simulate_test.io import layout
from gpu_simulate_test.orchestrate.configs import with_workload
from gpu_simulate_test.orchestrate.serving import served
from gpu_simulate_test.orchestrate.steps import make_workload, run_truth

CLIENTS = ("threads", "asyncio")


def renice_children(increment: int) -> None:
    """Lower the priority of every process this one started (the served vLLM)."""
    import psutil

    for child in psutil.Process().children(recursive=True):
        child.nice(child.nice() + increment)


def figures(real_dir: Path) -> dict[str, Any]:
    meta = json.loads((real_dir / layout.RUN_META).read_text())
    summary = json.loads((real_dir / "summary.json").read_text())
    signs = meta["disturbance"]["signs"]
    cpu = meta.get("cpu_cores_by_process", {})
    return {
        "late_p99_ms": signs["late_sends"]["figure"],
        "held_back_share": signs["held_back_streams"]["figure"],
        "foreign_cores": signs["foreign_cpu"]["figure"],
        "disturbed": meta["disturbance"]["disturbed"],
        "client_cores": cpu.get("client"),
        "client_wait_ms": 1e3 * (meta.get("client_run_queue_wait_s") or 0.0),
        "server_cores": round(sum(v for k, v in cpu.items() if k != "client"), 3),
        "ttft_p50_ms": summary["p50_ttft_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--clients", default=",".join(CLIENTS), help="comma-separated")
    parser.add_argument(
        "--server-nice", type=int, default=0, help="renice the served vLLM's processes by this"
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="bench-truth-client-"))
    cfg = to_typed(
        _compose("pipeline", [f"output.root={root}", "progress=false", "output.run_id=b"]),
        PipelineStageConfig,
    )
    n = args.requests
    shapes = {
        "default": make_workload(with_workload(cfg, "default", num_requests=n)),
        "bursty": make_workload(
            with_workload(
                cfg,
                "bursty",
                num_requests=n,
                qps=8.0,
                arrival=ArrivalConfig(process="gamma", burstiness=0.25),
                prompt_len=dataclasses.replace(cfg.workload.prompt_len, min=16, max=64),
                output_len=dataclasses.replace(cfg.workload.output_len, min=4, max=16),
            )
        ),
    }
    results: list[dict[str, Any]] = []
    clients = tuple(args.clients.split(","))
    with served(cfg, root, purpose="both clients") as at:
        if args.server_nice:
            renice_children(args.server_nice)
        for r in range(args.rounds):
            order = clients if r % 2 == 0 else clients[::-1]
            for shape, workload_dir in shapes.items():
                for client in order:
                    knobs = as_engine(at.backend, VllmBackendConfig)
                    c = dataclasses.replace(at, backend=dataclasses.replace(knobs, client=client))
                    real_dir = run_truth(c, workload_dir, run_id=f"{shape}-{client}-{r}")
                    row = {"round": r, "shape": shape, "client": client, **figures(real_dir)}
                    results.append(row)
                    print(json.dumps(row))
    print("\nmedian [min, max] over rounds")
    keys = (
        "late_p99_ms",
        "held_back_share",
        "client_cores",
        "client_wait_ms",
        "server_cores",
        "ttft_p50_ms",
    )
    print("| shape | client | " + " | ".join(keys) + " | disturbed runs |")
    print("| --- | --- | " + " | ".join("---" for _ in keys) + " | --- |")
    for shape in shapes:
        for client in clients:
            rows = [x for x in results if x["shape"] == shape and x["client"] == client]
            cells = []
            for key in keys:
                values = [float(x[key]) for x in rows if x[key] is not None]
                cells.append(
                    f"{statistics.median(values):.3g} [{min(values):.3g}, {max(values):.3g}]"
                    if values
                    else "–"
                )
            disturbed = sum(bool(x["disturbed"]) for x in rows)
            print(f"| {shape} | {client} | " + " | ".join(cells) + f" | {disturbed}/{len(rows)} |")
    if args.out:
        args.out.write_text(json.dumps({"rows": results}, indent=1))


if __name__ == "__main__":
    main()
