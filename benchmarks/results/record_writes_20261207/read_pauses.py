"""The pause before a busy step that takes a request in, and before the others, per
calibration rate and per real run at 85% of a stored fidelity campaign (``pauses.txt``).

Run from the repository's root: ``python benchmarks/results/record_writes_20261207/read_pauses.py
tmp/fidelity/<campaign> ...``. Pauses in ms; *big*: over 3 ms, *bigshare*: their share of the sum.
"""

import glob
import sys

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import serving_load


def stats(g):
    g = g[np.isfinite(g)]
    if len(g) == 0:
        return "none"
    big = g > 3
    return (
        f"n={len(g):4d} mean={g.mean():.3f} med={np.median(g):.3f} "
        f"p90={np.percentile(g, 90):.3f} trim(<3ms)={g[~big].mean():.3f} big={big.sum()} "
        f"bigshare={g[big].sum() / g.sum():.2f}"
    )


def pauses(df):
    f = serving_load.step_features(df.reset_index(drop=True))
    return f["gap_s"].to_numpy() * 1e3, f["arrivals"].to_numpy() > 0, f["busy"].to_numpy()


for base in sys.argv[1:]:
    print("==", base.rstrip("/").split("/")[-1])
    s = pd.read_csv(f"{base}/profiles/load2/cpu/qwen3_tiny/serving_steps.csv")
    for rate, p in s.groupby("rate_qps"):
        parts = [pauses(r) for _, r in p.groupby("replay", sort=False)]
        g = np.concatenate([x[0][x[2]] for x in parts])
        t = np.concatenate([x[1][x[2]] for x in parts])
        print(f" cal rate {rate:6.1f} quiet {stats(g[~t])}\n                taking {stats(g[t])}")
    for run in sorted(glob.glob(f"{base}/runs/real_bench/vllm-load2*")):
        g, t, b = pauses(pd.read_csv(f"{run}/engine_schedule.csv"))
        name = run.split("/")[-1]
        print(" real", name, "quiet", stats(g[b & ~t]), "\n      taking", stats(g[b & t]))
