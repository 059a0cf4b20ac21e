"""What vLLM's prefix cache costs our V1 scheduler: the same workload with the cache on and off.

Issue 45's target: 100,000 requests with the cache within 2x the time without it; memory
reported. The loop alone (:func:`gpu_simulate_test.simulator.run.run_v1`), timed by a
fixed linear step clock (no predictor: its cost is the same either way), on two workloads:

- ``shared_prefix``: 16 prefixes of 256 tokens by a Zipf share, then 16-256 own tokens, outputs
  8-128, Poisson arrivals;
- ``multi_turn``: sessions of 2-6 turns (user messages 16-128 tokens, outputs 8-128, think time
  0.5-5 s), sessions arriving by Poisson, a closed loop per session.

Each configuration is run ``--repeats`` times, on and off alternated; the figure is the best CPU
time of each (``time.process_time``) and their ratio; peak memory by ``tracemalloc`` in a
separate pass (it slows the run). Knobs: ``max_num_batched_tokens`` 2048, ``max_num_seqs`` 128,
block size 16, a cache of ``--blocks`` blocks (evictions happen).

Run: ``python -m benchmarks.speed.bench_prefix_cache [--requests 100000] [--repeats 3] [--only NAME]
[--out F.json]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from gpu_simulate_test.simulator.run import run_v1
from gpu_simulate_test.simulator.types import Composition, V1Params

TARGET_RATIO = 2.0


class LinearClock:
    """A step takes 2 ms plus 20 us per token scheduled (no predictor)."""

    def gap(self, index: int) -> float:
        return 0.0005

    def lead(self, index: int) -> float:
        return 0.0005

    def body(self, index: int, step: Composition) -> float:
        return 0.002 + 2e-5 * (step.prefill_tokens + step.decode_tokens)


def shared_prefix(n: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, 17)
    prefix = rng.choice(16, n, p=weights / weights.sum())
    own = rng.integers(16, 257, n)
    segments = [
        [(("P", int(k)), 256), (("U", r), int(u))]
        for r, (k, u) in enumerate(zip(prefix, own, strict=True))
    ]
    return {
        "arrivals": np.cumsum(rng.exponential(1 / 40.0, n)),
        "prompts": own + 256,
        "outputs": rng.integers(8, 129, n),
        "segments": segments,
        "after": None,
    }


def multi_turn(n: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    arrivals: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    segments: list[list[tuple[Any, int]]] = []
    after: list[tuple[int, float]] = []
    t = 0.0
    while len(prompts) < n:
        t += float(rng.exponential(1 / 10.0))
        turns = min(int(rng.integers(2, 7)), n - len(prompts))
        prompt: list[tuple[Any, int]] = []
        for turn in range(turns):
            r = len(prompts)
            if turn:
                after[r - 1] = (r, float(rng.uniform(0.5, 5.0)))
            prompt = [*prompt, (("U", r), int(rng.integers(16, 129)))]
            segments.append(prompt)
            prompts.append(sum(x for _, x in prompt))
            outputs.append(int(rng.integers(8, 129)))
            arrivals.append(t if turn == 0 else np.nan)
            after.append((-1, 0.0))
            prompt = [*prompt, (("O", r), outputs[r])]
    return {
        "arrivals": np.array(arrivals),
        "prompts": np.array(prompts),
        "outputs": np.array(outputs),
        "segments": segments,
        "after": after,
    }


def one(work: dict[str, Any], caching: bool, blocks: int) -> float:
    params = V1Params(
        max_num_batched_tokens=2048,
        max_num_seqs=128,
        block_size=16,
        num_blocks=blocks,
        enable_prefix_caching=caching,
    )
    start = time.process_time()
    run_v1(
        params,
        LinearClock(),
        work["arrivals"],
        work["prompts"],
        work["outputs"],
        segments=work["segments"] if caching else None,
        after=work["after"],
    )
    return time.process_time() - start


def peak_mib(work: dict[str, Any], caching: bool, blocks: int) -> float:
    tracemalloc.start()
    one(work, caching, blocks)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=4096)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", choices=("shared_prefix", "multi_turn"), default=None)
    args = parser.parse_args()
    results: dict[str, Any] = {}
    for name, make in (("shared_prefix", shared_prefix), ("multi_turn", multi_turn)):
        if args.only and name != args.only:
            continue
        work = make(args.requests, 0)
        times: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(args.repeats):
            for mode in ("off", "on"):
                times[mode].append(one(work, mode == "on", args.blocks))
        best = {mode: min(values) for mode, values in times.items()}
        memory = {mode: peak_mib(work, mode == "on", args.blocks) for mode in ("off", "on")}
        ratio = best["on"] / best["off"]
        results[name] = {
            "cpu_s": times,
            "best_s": best,
            "ratio_on_off": ratio,
            "ratio_spread": [
                min(times["on"]) / max(times["off"]),
                max(times["on"]) / min(times["off"]),
            ],
            "median_ratio": statistics.median(times["on"]) / statistics.median(times["off"]),
            "peak_mib": memory,
            "meets_target": ratio <= TARGET_RATIO,
        }
        print(
            f"{name}: {args.requests} requests, off {best['off']:.2f} s, on {best['on']:.2f} s "
            f"(best of {args.repeats}), ratio {ratio:.2f} (target <= {TARGET_RATIO}); peak "
            f"memory off {memory['off']:.0f} MiB, on {memory['on']:.0f} MiB",
            flush=True,
        )
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "machine": platform.processor() or platform.machine(),
            "python": platform.python_version(),
            "command": "python -m benchmarks.speed.bench_prefix_cache "
            f"--requests {args.requests} --repeats {args.repeats} --blocks {args.blocks}"
            + (f" --only {args.only}" if args.only else ""),
            "results": results,
        }
        args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
