"""Time to compare 1,000,000 requests (target: the comparison math under 10 s on 2 cores).

Run: ``python -m benchmarks.speed.bench_compare [--requests N] [--plots]``. Builds a real and a
simulated ``request_metrics`` table (``io.schemas.REQUEST_METRICS`` columns; 1% of the real
requests failed) and the real side's pooled ITLs in memory, then times the comparison math: the
join, percentiles, relative errors, throughput, per-request errors, length trends and the
discrepancy findings. With ``--plots`` the three PNGs are drawn and timed separately.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from gpu_simulate_test.compare.comparison import compare, discrepancies, join_requests

TARGET_S = 10.0


def request_tables(n: int, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """Real and simulated request tables of one synthetic workload, and the real ITL pool."""
    rng = np.random.default_rng(seed)
    prefill = rng.integers(16, 2048, n)
    decode = rng.integers(1, 129, n)  # 1-128 output tokens: ~64 M pooled ITLs
    arrival = np.cumsum(rng.exponential(1 / 50.0, n))
    ttft = 0.02 + prefill * 2e-5 + rng.exponential(0.05, n)
    tpot = 0.01 + rng.gamma(2.0, 0.002, n)
    status = np.where(rng.random(n) < 0.01, "error", "ok")

    def frame(scale_ttft: float, scale_tpot: float, noise: float, failed: bool) -> pd.DataFrame:
        t = ttft * scale_ttft * rng.lognormal(0, noise, n)
        e = t + tpot * scale_tpot * (decode - 1) * rng.lognormal(0, noise, n)
        return pd.DataFrame(
            {
                "request_id": np.arange(n),
                "arrival_time_s": arrival,
                "num_prefill_tokens": prefill,
                "num_decode_tokens": decode,
                "ttft_s": np.where(status == "ok", t, np.nan) if failed else t,
                "tpot_s": np.where(decode >= 2, (e - t) / np.maximum(decode - 1, 1), np.nan),
                "e2e_s": np.where(status == "ok", e, np.nan) if failed else e,
                "status": status if failed else "ok",
            }
        )

    real = frame(1.0, 1.0, 0.1, failed=True)
    sim = frame(0.8, 1.15, 0.05, failed=False)
    # one gap per output token after the first, of the requests that finished
    ok = status == "ok"
    itl = np.repeat(tpot[ok], decode[ok] - 1)
    itl *= rng.lognormal(0, 0.2, itl.size)
    return real, sim, itl


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plots", action="store_true", help="also draw and time the PNGs")
    args = parser.parse_args()
    started = time.perf_counter()
    real, sim, itl = request_tables(args.requests)
    built_s = time.perf_counter() - started

    timings: list[tuple[float, float, float]] = []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        joined, excluded = join_requests(real, sim, where="bench")
        t1 = time.perf_counter()
        result = compare(joined, excluded, itl)
        t2 = time.perf_counter()
        findings = discrepancies(result)
        t3 = time.perf_counter()
        timings.append((t1 - t0, t2 - t1, t3 - t0))
    join_s, compare_s, total_s = min(timings, key=lambda t: t[2])

    print(f"requests                     {args.requests:>12,}")
    print(f"compared (ok on both sides)  {len(result.joined):>12,}")
    print(f"excluded                     {len(result.excluded):>12,}")
    print(f"pooled real ITLs             {itl.size:>12,}")
    print(f"build tables (once)          {built_s:>12.3f} s")
    print(f"join (best of {args.repeats})             {join_s:>12.3f} s")
    print(f"compare (same repeat)        {compare_s:>12.3f} s")
    print(f"join + compare + findings    {total_s:>12.3f} s")
    print(f"target                       {TARGET_S:>12.3f} s")
    print(f"ratio to target              {total_s / TARGET_S:>12.2f}  (< 1 meets it)")
    if args.plots:
        from gpu_simulate_test.compare.stage import draw_plots

        context = {"real": {"model": "bench", "hardware": "bench", "backend": "synthetic"}}
        with tempfile.TemporaryDirectory() as out:
            t0 = time.perf_counter()
            draw_plots(result, Path(out), context)
            print(f"plots (3 PNGs, separately)   {time.perf_counter() - t0:>12.3f} s")
    print(f"findings: {len(findings)}; first: {findings[0]}")


if __name__ == "__main__":
    main()
