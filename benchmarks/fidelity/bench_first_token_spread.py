"""A first token's way back on a busy engine: the queue's mean delay, or the queue plus the
measured spread per bucket of requests in flight (``vidur.frontend_busy_spread``)?

For each RUN (a fidelity campaign, ``tmp/fidelity/<id>``) the front end's queue and its busy
spread (:func:`~gpu_simulate_test.calibration.frontend_queue.fit`) are fitted on one load's real
run (``--fit-load``, 50% of capacity by default) and read at the campaign's other loads, both
real runs each: never judged on what it was fitted on. Per run: the first tokens' way back (from
the engine's stamp of the step that made the token to the client), mean / p50 / p90 / p99 in
ms, measured, on the queue, and on the queue with a seeded draw from the spread of the bucket
of requests in flight at each request's send. The real runs' own steps and sends drive the
queue, so what differs is the way back alone.

Run: ``python -m benchmarks.fidelity.bench_first_token_spread RUN [RUN ...] [--fit-load 1]
[--seed 0]``
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import frontend_queue as fq
from gpu_simulate_test.calibration import input_spread

STATS = (50, 90, 99)


def observed(run: Path) -> fq.Observed:
    """A real run's tokens paired with their steps, each marked first or not and with the
    requests in flight at its request's send (reached the engine before it, finished after)."""
    requests = pd.read_csv(run / "request_metrics.csv")
    requests = requests[requests["status"] == "ok"]
    tokens = pd.read_csv(run / "token_metrics.csv")
    schedule = pd.read_csv(run / "engine_schedule.csv")
    ids = requests["request_id"].to_numpy()
    prompts = {str(r): int(p) for r, p in zip(ids, requests["num_prefill_tokens"], strict=True)}
    made = fq.emitted(schedule, prompts)
    sent = requests["arrival_time_s"].to_numpy(dtype=float)
    reached = requests["engine_arrival_time_s"].to_numpy(dtype=float)
    done = requests["engine_last_token_time_s"].to_numpy(dtype=float)
    in_flight = {
        int(r): int(np.sum((reached < t) & (done > t))) for r, t in zip(ids, sent, strict=True)
    }
    running = tokens["request_id"].map(in_flight).fillna(-1).astype(int)
    return fq.observed(
        sent.tolist(),
        schedule["end_time_s"].to_numpy(dtype=float),
        made.step_tokens,
        tokens["engine_time_s"].tolist(),
        tokens["time_s"].tolist(),
        (tokens["token_index"] == 0).tolist(),
        token_running=running.tolist(),
    )


def first_tokens(
    queue: fq.FrontEndQueue, run: fq.Observed, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The first tokens' way back (s): measured, the queue's, the queue's plus a draw from the
    busy spread of their bucket (an idle engine's first tokens keep the queue's)."""
    modelled = queue.delivery_delays_s(run.sends_s, run.step_end_s, run.step_tokens)
    first = run.first
    base = modelled[run.token_step][first] + queue.first_ms / 1e3
    running = (np.zeros(len(first), int) if run.running is None else run.running)[first]
    levels = rng.random(len(base))
    drawn = input_spread.spread_s(queue.first_busy_residual_ms, levels, running)
    return run.delay_s[first], base, base + np.where(running > 0, drawn, 0.0)


def cells(values_s: np.ndarray) -> str:
    ms = 1e3 * values_s
    return " / ".join(f"{v:.2f}" for v in (ms.mean(), *np.percentile(ms, STATS)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--fit-load", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    for campaign in args.runs:
        real = campaign / "runs" / "real_bench"
        fitted = fq.fit([observed(real / f"vllm-load{args.fit_load}")])
        if fitted is None:
            raise SystemExit(f"{campaign}: too few tokens at load {args.fit_load} to fit")
        queue = fq.FrontEndQueue.from_calibration(fitted, str(campaign))
        buckets = ", ".join(
            f"{k}+: p50 {v[10]:+.2f}, p90 {v[18]:+.2f}" for k, v in queue.first_busy_residual_ms
        )
        print(f"== {campaign.name}: fitted on load {args.fit_load}; busy spread (ms) {buckets}")
        print("run | first tokens | measured | queue | queue + spread  (mean / p50 / p90 / p99 ms)")
        for run in sorted(real.glob("vllm-load*")):
            if run.name.startswith(f"vllm-load{args.fit_load}") or "rerun" in run.name:
                continue
            measured, base, spread = first_tokens(queue, observed(run), rng)
            print(f"{run.name} | {len(measured)} | {cells(measured)} | {cells(base)} | "
                  f"{cells(spread)}")  # fmt: skip


if __name__ == "__main__":
    main()
