"""Print a markdown table of real vs simulated latency percentiles for one workload.

A stop-gap until the compare stage lands: ``python -m benchmarks.summarize_real_vs_sim REAL SIM``
with a real_bench run directory and a vidur_simulate run directory of the same workload.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.io.schemas import REQUEST_METRICS, TOKEN_METRICS

PERCENTILES = (50, 90, 99)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("real", type=Path)
    parser.add_argument("sim", type=Path)
    args = parser.parse_args()
    real = read_csv(args.real / "request_metrics.csv", REQUEST_METRICS)
    sim = read_csv(args.sim / "request_metrics.csv", REQUEST_METRICS)
    real_id = read_json(args.real / "run_meta.json")["workload_id"]
    sim_id = read_json(args.sim / "run_meta.json")["workload_id"]
    if real_id != sim_id:
        raise SystemExit(f"different workloads: real {real_id}, simulated {sim_id}")
    tokens = read_csv(args.real / "token_metrics.csv", TOKEN_METRICS)
    print(f"workload {real_id}, {len(real)} requests (real) / {len(sim)} (simulated)\n")
    print("| metric (ms) | percentile | real | simulated | error (sim/real - 1) |")
    print("| --- | --- | --- | --- | --- |")
    for column, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        for q in PERCENTILES:
            r = float(np.nanpercentile(real[column].to_numpy(dtype=float), q)) * 1e3
            s = float(np.nanpercentile(sim[column].to_numpy(dtype=float), q)) * 1e3
            print(f"| {label} | p{q} | {r:.1f} | {s:.1f} | {s / r - 1:+.1%} |")
    itl = tokens["itl_s"].dropna().to_numpy(dtype=float) * 1e3
    itl_text = " / ".join(f"{np.percentile(itl, q):.1f}" for q in PERCENTILES)
    print(f"| ITL (real only) | p50 / p90 / p99 | {itl_text} | | |")
    for name, frame in (("real", real), ("simulated", sim)):
        span = float(
            (frame["arrival_time_s"] + frame["e2e_s"]).max() - frame["arrival_time_s"].min()
        )
        print(
            f"\n{name}: {len(frame) / span:.2f} req/s, "
            f"{frame['num_decode_tokens'].sum() / span:.0f} output tok/s over {span:.1f} s"
        )


if __name__ == "__main__":
    main()
