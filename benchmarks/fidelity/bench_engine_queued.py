"""Where vLLM's engine queues a request that came while a step ran: right after that step's
end, or right before the next step's scheduling?

For each stored real run (a vLLM server with the step record: ``engine_schedule.csv`` and the
request table's ``engine_arrival_time_s``, vLLM's QUEUED stamp), each request queued at most
``--busy-ms`` after a step's end (not an idle engine's wake-up): how long after that end, and
how long before the next step's start, its stamp lies. vLLM's ``run_busy_loop`` reads its input
right before it schedules, so the second is tens of microseconds; ``vllm_v1`` queues such a
request at the next step's scheduling.

Run: ``python -m benchmarks.fidelity.bench_engine_queued RUN_DIR [RUN_DIR ...]``
(``tmp/real_bench/<run_id>`` directories).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd


def stamps(run_dir: Path, busy_ms: float) -> tuple[int, int, np.ndarray, np.ndarray]:
    """(requests, those queued during or just after a step, ms after its end, ms before the
    next start)."""
    steps = pd.read_csv(run_dir / "engine_schedule.csv")
    requests = pd.read_csv(run_dir / "request_metrics.csv")
    starts = steps["start_time_s"].to_numpy(dtype=float)
    ends = steps["end_time_s"].to_numpy(dtype=float)
    queued = requests["engine_arrival_time_s"].to_numpy(dtype=float)
    k = np.searchsorted(starts, queued)
    inside = (k > 0) & (k < len(starts))
    after = 1e3 * (queued[inside] - ends[k[inside] - 1])
    before = 1e3 * (starts[k[inside]] - queued[inside])
    busy = after < busy_ms
    return len(queued), int(busy.sum()), after[busy], before[busy]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--busy-ms", type=float, default=2.0)
    args = parser.parse_args()
    print("| run | requests | queued after a step | ms after its end (min / median / max) "
          "| ms before the next start (min / median / max) |")  # fmt: skip
    print("| --- | --- | --- | --- | --- |")
    for run in args.runs:
        n, busy, after, before = stamps(run, args.busy_ms)
        if not busy:
            print(f"| {run.name} | {n} | 0 | – | – |")
            continue
        spans = [" / ".join(f"{f(x):.3f}" for f in (np.min, np.median, np.max))
                 for x in (after, before)]  # fmt: skip
        print(f"| {run.name} | {n} | {busy} | {spans[0]} | {spans[1]} |")


if __name__ == "__main__":
    main()
