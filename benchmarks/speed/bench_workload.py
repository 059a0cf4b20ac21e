"""Time to generate and write a 100,000-request workload (target: under 5 s on a 2-core machine).

Run: ``python -m benchmarks.speed.bench_workload [--requests N]``. Prints the figures and the ratio
to the target; writes into a temporary directory that is removed afterwards.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import asdict, replace

from gpu_simulate_test.config.presets import model_preset
from gpu_simulate_test.config.schema import LengthDistConfig, WorkloadConfig
from gpu_simulate_test.core.traffic.workloads import generate, write_workload
from gpu_simulate_test.io.runs import start_run

TARGET_S = 5.0
QWEN3_TINY = model_preset("qwen3_tiny")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cfg = replace(
        WorkloadConfig(),
        num_requests=args.requests,
        qps=10.0,
        prompt_len=LengthDistConfig(kind="uniform", min=16, max=256),
        output_len=LengthDistConfig(kind="uniform", min=8, max=64),
    )
    timings: list[tuple[float, float]] = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as root:
            start = time.perf_counter()
            workload, notes = generate(cfg, QWEN3_TINY)
            generated = time.perf_counter()
            with start_run(root, "workload", f"bench{repeat}", asdict(cfg)) as run:
                write_workload(run, workload, cfg, QWEN3_TINY, notes, show_progress=False)
            timings.append((generated - start, time.perf_counter() - start))
    best_generate, best_total = min(timings, key=lambda t: t[1])
    tokens = int(workload.num_prefill_tokens.sum())
    print(f"requests                 {args.requests:>12,}")
    print(f"prompt tokens written    {tokens:>12,}")
    print(f"generate (best of {args.repeats})     {best_generate:>12.3f} s")
    print(f"generate + write (best)  {best_total:>12.3f} s")
    print(f"target                   {TARGET_S:>12.3f} s")
    print(f"ratio to target          {best_total / TARGET_S:>12.2f}  (< 1 meets it)")


if __name__ == "__main__":
    main()
