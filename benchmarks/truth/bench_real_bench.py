"""Harness overhead of the real bench, and how close arrivals land to their schedule.

1. Decode tokens/s of the same requests (all arriving at once) through the full ``real_bench``
   harness with ``hf_cb`` vs the bare transformers continuous-batching engine (no streaming, no
   timestamps, no replay thread). Target: harness / bare >= 0.97.
2. Arrival-time error percentiles of a Poisson replay through the harness (target: < 1 ms).

Run: ``python -m benchmarks.truth.bench_real_bench [--requests N] [--repeats R] [--qps Q]``.
Uses the tiny Qwen3 on the configured device (CPU here); writes into a temporary directory.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra

from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import WorkloadStageConfig
from gpu_simulate_test.core.engines._inprocess import load_model
from gpu_simulate_test.core.engines.hf_cb import make_cb_config
from gpu_simulate_test.core.traffic.requests import load_requests
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io.artifacts import read_json
from gpu_simulate_test.real_bench.contract import SUMMARY
from gpu_simulate_test.real_bench.stage import run
from gpu_simulate_test.workload.stage import run as build_workload

TARGET_RATIO = 0.97
TARGET_ARRIVAL_MS = 1.0


def _compose(name: str, overrides: list[str]) -> Any:
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name=name, overrides=overrides)


def make_workload(root: Path, run_id: str, requests: int, qps: float, process: str) -> Path:
    cfg = to_typed(
        _compose(
            "workload",
            [
                f"output.root={root}",
                f"output.run_id={run_id}",
                f"workload.num_requests={requests}",
                f"workload.qps={qps}",
                f"workload.arrival.process={process}",
                "workload.prompt_len.min=16",
                "workload.prompt_len.max=64",
                "workload.output_len.min=16",
                "workload.output_len.max=32",
                "progress=false",
            ],
        ),
        WorkloadStageConfig,
    )
    return build_workload(cfg, {"bench": run_id})


def bench_cfg(root: Path, workload: Path, run_id: str) -> RealBenchStageConfig:
    cfg = to_typed(
        _compose(
            "real_bench",
            [
                f"workload_dir={workload}",
                f"output.root={root}",
                f"output.run_id={run_id}",
                "progress=false",
                "num_warmup_requests=2",
            ],
        ),
        RealBenchStageConfig,
    )
    return cfg


def harness_tokens_per_s(cfg: RealBenchStageConfig) -> float:
    path = run(cfg, {"bench": cfg.output.run_id})
    summary = read_json(path / SUMMARY)
    return float(summary["output_throughput"])


def bare_tokens_per_s(cfg: RealBenchStageConfig, model: Any) -> float:
    """The same requests through the engine alone: add them all, drain the results."""
    from transformers import GenerationConfig

    requests = load_requests(load_workload(cfg.workload_dir))
    cb_config, _ = make_cb_config(cfg)
    manager = model.init_continuous_batching(
        generation_config=GenerationConfig(do_sample=False, eos_token_id=-1, pad_token_id=0),
        continuous_batching_config=cb_config,
    )
    manager.start()
    try:
        for i, req in enumerate(requests[:2]):  # the same warm-up as the harness
            manager.add_request(list(req.prompt_token_ids or ()), f"w{i}", req.num_decode_tokens)
        for _ in range(2):
            manager.get_result(timeout=60)
        start = time.perf_counter()
        for req in requests:
            manager.add_request(
                list(req.prompt_token_ids or ()),
                request_id=f"r{req.request_id}",
                max_new_tokens=req.num_decode_tokens,
                eos_token_id=-1,
            )
        tokens = 0
        for _ in requests:
            out = manager.get_result(timeout=120)
            assert out is not None and not out.error
            tokens += len(out.generated_tokens)
        elapsed = time.perf_counter() - start
    finally:
        manager.stop(block=True)
    return tokens / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--qps", type=float, default=20.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        burst = make_workload(root, "burst", args.requests, 1.0, "all_at_once")
        poisson = make_workload(root, "poisson", args.requests, args.qps, "poisson")
        base = bench_cfg(root, burst, "h0")
        model = load_model(base)
        harness: list[float] = []
        bare: list[float] = []
        for repeat in range(args.repeats):  # interleaved, so machine load hits both alike
            bare.append(bare_tokens_per_s(base, model))
            harness.append(
                harness_tokens_per_s(
                    replace(base, output=replace(base.output, run_id=f"h{repeat}"))
                )
            )
        arrival_run = run(bench_cfg(root, poisson, "arrivals"), {"bench": "arrivals"})
        arrival = read_json(arrival_run / SUMMARY)["arrival_error_ms"]
    ratio = max(harness) / max(bare)
    print(f"requests                      {args.requests:>10}")
    print(f"bare engine tokens/s (best)   {max(bare):>10.1f}   all: {[round(x) for x in bare]}")
    print(
        f"harness tokens/s (best)       {max(harness):>10.1f}   all: {[round(x) for x in harness]}"
    )
    print(f"harness / bare                {ratio:>10.3f}   (target >= {TARGET_RATIO})")
    print(
        f"arrival error ms at {args.qps:g} req/s  p50 {arrival['p50']:.3f}"
        f"  p90 {arrival['p90']:.3f}  p99 {arrival['p99']:.3f}  (target < {TARGET_ARRIVAL_MS})"
    )
    print(json.dumps({"ratio": ratio, "arrival_error_ms": arrival}, default=float))


if __name__ == "__main__":
    main()
