"""A fleet's simulation speed: ``R`` replicas behind a router against one engine, the same
number of requests, each replica at the one engine's load (issue 62's target: 8 replicas x
100,000 requests in at most 2x the time of 1 replica x 100,000).

The ``vidur_simulate`` stage on tiny Qwen3 with a synthetic CPU bundle (``vllm_v1``, cap 32,
512 tokens per step; prompts 32-1,024 tokens, outputs 8-128, Poisson arrivals at ``--qps`` per
replica), warm predictor cache; one engine and the fleet alternated for ``--rounds`` rounds; the
figure is the ratio of the stage's simulation times (``run_meta.json`` ``timings_s``), with the
requests per replica and the most loaded replica's share as the check that the load was spread.

A fleet steps its engines one step at a time, in time order (its router reads them between
steps); one engine takes runs of pure decode steps in one pass (decode stretches). The ratio is
the price of that.

Run: ``python -m benchmarks.speed.bench_fleet [--requests 100000] [--replicas 8]
[--router vllm_dp] [--rounds 2]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
from pathlib import Path

from benchmarks.speed.bench_event_loop import SCHEDULER, config, time_stage
from benchmarks.speed.bench_vidur_simulate import make_workload
from gpu_simulate_test.config.fleet import FleetConfig
from gpu_simulate_test.vidur_profile.synthetic import QWEN3_TINY, write_synthetic_bundle

TARGET_RATIO = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--router", default="vllm_dp")
    parser.add_argument("--qps", type=float, default=40.0, help="per replica")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    v1 = dataclasses.replace(SCHEDULER, name="vllm_v1")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_synthetic_bundle(root / "profiles", QWEN3_TINY)
        time_stage(config(root, make_workload(root, 200, args.qps), "warm", scheduler=v1))
        one_load = make_workload(root / "one", args.requests, args.qps)
        fleet_load = make_workload(root / "fleet", args.requests, args.qps * args.replicas)
        times: dict[str, list[float]] = {"one": [], "fleet": []}
        for k in range(args.rounds):
            for label, load in (("one", one_load), ("fleet", fleet_load)):
                cfg = config(root, load, f"{label}{k}", scheduler=v1)
                if label == "fleet":
                    fleet = FleetConfig(replicas=args.replicas, router=args.router)
                    cfg = dataclasses.replace(cfg, fleet=fleet)
                whole, _, meta = time_stage(cfg)
                simulated = float(meta["timings_s"]["simulation"])  # type: ignore[index]
                times[label].append(simulated)
                spread = ""
                if label == "fleet":
                    report = meta["fleet"]
                    counts = [r["requests"] for r in report["per_replica"]]  # type: ignore[index]
                    spread = f"  per replica {min(counts)}..{max(counts)}"
                print(
                    f"round {k} {label:5s} simulation {simulated:8.2f} s  stage {whole:8.2f} s"
                    f"{spread}"
                )
        ratios = [f / o for f, o in zip(times["fleet"], times["one"], strict=True)]
        print(
            f"{args.replicas} replicas ({args.router}) / 1, {args.requests:,} requests each: "
            f"simulation {statistics.median(ratios):.2f}x (rounds "
            f"{', '.join(f'{r:.2f}' for r in ratios)}; target <= {TARGET_RATIO:.0f}x)"
        )


if __name__ == "__main__":
    main()
