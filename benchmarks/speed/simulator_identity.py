"""vLLM's V1 engine held to its own bytes across a refactor: ``run_v1`` on random cases (prefix
caching, closed loops, preemption, chunked prefill, the long-prefill threshold, tight caches)
under a seeded clock, and one sha256 over every rows table, schedule, preemption count, prefix
cache total and error message.

Each case runs twice: under a clock that times every step from its composition, and under the
same clock with a ``decode_body`` (an engine that finds one takes stretches of pure decode
steps in one pass); both ``TOTAL`` lines must agree, and with another commit's.

Run it with the code of two commits and compare the ``TOTAL`` lines (an older checkout keeps
``run_v1`` in ``vidur_simulate``; this script finds it there too):

    PYTHONPATH=<old checkout>/src python -m benchmarks.speed.simulator_identity
    python -m benchmarks.speed.simulator_identity [--cases 400]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import math
from typing import Any

import numpy as np


def _engine() -> tuple[Any, Any]:
    """(V1Params, run_v1) from wherever this checkout keeps them."""
    for types, run in (
        ("gpu_simulate_test.simulator.types", "gpu_simulate_test.simulator.run"),
        ("gpu_simulate_test.vidur_simulate.v1_types", "gpu_simulate_test.vidur_simulate.vllm_v1"),
    ):
        try:
            return importlib.import_module(types).V1Params, importlib.import_module(run).run_v1
        except ImportError:
            continue
    raise SystemExit("no run_v1 in this checkout")


class SeededClock:
    """Gaps, leads and bodies that depend on the step's composition and a seeded draw."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def gap(self, index: int) -> float:
        return float(self.rng.choice([0.0, 0.0005, 0.002]))

    def lead(self, index: int) -> float:
        return float(self.rng.choice([0.0, 0.001]))

    def body(self, index: int, step: Any) -> float:
        kv = sum(size for _, size in step.chunks)
        return (
            0.002 + 1e-5 * step.prefill_tokens + 3e-5 * step.decode_tokens
            + 1e-6 * len(step.chunks) + 1e-7 * step.first_scheduled + 1e-8 * min(step.idle_s, 1e3)
            + 1e-9 * kv
        )  # fmt: skip


class StretchingClock(SeededClock):
    """The same clock, with the body of a pure decode step asked without its chunks (an engine
    that has it takes decode stretches in one pass): the same value, the same draws."""

    def decode_body(self, index: int, start_s: float, requests: int, kv_tokens: int) -> float:
        return (
            0.002 + 1e-5 * 0 + 3e-5 * requests + 1e-6 * requests + 1e-7 * 0 + 1e-8 * min(0.0, 1e3)
            + 1e-9 * kv_tokens
        )  # fmt: skip


def case(seed: int, params_type: Any) -> tuple[Any, ...]:
    """A random workload and engine: shared prefixes, sometimes a closed loop of turns."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 120))
    bs = int(rng.choice([8, 16, 32]))
    caching = bool(rng.integers(0, 2))
    closed = caching and seed % 3 == 0
    prefixes = [int(rng.integers(1, 100)) for _ in range(3)]
    segs: list[list[tuple[Any, int]]] = []
    prompts: list[int] = []
    outs: list[int] = []
    arr: list[float] = []
    after: list[tuple[int, float]] = []
    t = 0.0
    for r in range(n):
        own = int(rng.integers(1, 200))
        k = int(rng.integers(0, 4))
        seg: list[tuple[Any, int]] = ([(("P", k), prefixes[k])] if k < 3 else []) + [
            (("U", r), own)
        ]
        if closed and r > 0 and rng.random() < 0.5:
            seg = [*segs[r - 1], (("O", r - 1), outs[r - 1]), (("U", r), own)]
            arr.append(math.nan)
            after[r - 1] = (r, float(rng.choice([0.0, 0.3])))
        else:
            t += float(rng.exponential(rng.choice([0.001, 0.01, 0.1])))
            arr.append(t)
        segs.append(seg)
        prompts.append(sum(x for _, x in seg))
        outs.append(int(rng.integers(1, 60)))
        after.append((-1, 0.0))
    longest = max(math.ceil((p + o) / bs) for p, o in zip(prompts, outs, strict=True))
    params = params_type(
        max_num_batched_tokens=int(rng.choice([16, 64, 256, 2048])),
        max_num_seqs=int(rng.choice([1, 4, 32, 256])),
        block_size=bs,
        num_blocks=int(longest + 1 + rng.integers(0, 3 * longest)),
        long_prefill_token_threshold=int(rng.choice([0, 0, 32])),
        enable_chunked_prefill=bool(rng.integers(0, 4) > 0),
        enable_prefix_caching=caching,
    )
    return (
        params, np.array(arr), np.array(prompts), np.array(outs),
        segs if caching else None, after if closed else None,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cases", type=int, default=400)
    args = parser.parse_args()
    params_type, run_v1 = _engine()
    for clock in (SeededClock, StretchingClock):
        print(clock.__name__, "TOTAL", total_hash(params_type, run_v1, clock, args.cases))


def total_hash(params_type: Any, run_v1: Any, clock: type[SeededClock], cases: int) -> str:
    """One sha256 over every case's result (or error) under ``clock``."""
    total = hashlib.sha256()
    for seed in range(cases):
        params, arr, prompts, outs, segs, after = case(seed, params_type)
        try:
            res = run_v1(params, clock(seed), arr, prompts, outs, segments=segs, after=after)
            blob = (
                res.requests.to_csv(index=False) + res.schedule.to_csv(index=False)
                + str(res.preemptions) + str(res.prefix_cache)
            )  # fmt: skip
        except Exception as exc:  # the refused cases must be refused alike
            blob = f"{type(exc).__name__}: {exc}"
        total.update(blob.encode())
    return total.hexdigest()


if __name__ == "__main__":
    main()
