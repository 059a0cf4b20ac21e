"""Time one operation: warm-up, repeats, and min/max/mean/median/std in milliseconds.

On CUDA each repeat is bracketed by ``torch.cuda.Event``s after a ``synchronize``, so a repeat
measures the op from an idle GPU, launch latency included (as in eager serving); on CPU each
repeat is timed with ``time.perf_counter_ns``. Big shapes stop repeating early once a time budget
is spent, after at least ``min_repeats`` repeats.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

CUDA_EVENTS = "cuda_event"
PERF_COUNTER = "perf_counter_ns"


@dataclass(frozen=True)
class TimingStats:
    """Summary of the timed repeats of one op, in milliseconds (std: population, ddof=0)."""

    min_ms: float
    max_ms: float
    mean_ms: float
    median_ms: float
    std_ms: float
    repeats: int

    @classmethod
    def from_samples(cls, samples_ms: list[float] | np.ndarray) -> TimingStats:
        values = np.asarray(samples_ms, dtype=float)
        if values.size == 0:
            raise ValueError("no timing samples")
        return cls(
            min_ms=float(values.min()),
            max_ms=float(values.max()),
            mean_ms=float(values.mean()),
            median_ms=float(np.median(values)),
            std_ms=float(values.std()),
            repeats=int(values.size),
        )

    def as_vidur(self, op: str) -> dict[str, float]:
        """Vidur's ``time_stats.<op>.<stat>`` columns."""
        return {
            f"time_stats.{op}.min": self.min_ms,
            f"time_stats.{op}.max": self.max_ms,
            f"time_stats.{op}.mean": self.mean_ms,
            f"time_stats.{op}.median": self.median_ms,
            f"time_stats.{op}.std": self.std_ms,
        }


@dataclass(frozen=True)
class TimingPolicy:
    """How many times an op runs: ``warmup`` untimed, then up to ``repeats`` timed ones.

    Once the timed repeats of one op have taken ``budget_s`` (and at least ``min_repeats`` ran),
    the rest are skipped; warm-up likewise stops after one iteration once the budget is spent.
    """

    warmup: int = 3
    repeats: int = 10
    min_repeats: int = 3
    budget_s: float = 0.05

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.repeats < 1 or self.min_repeats < 1 or self.budget_s < 0:
            raise ValueError(f"bad timing policy {self}")


def timing_method(device: str) -> str:
    """What :func:`measure` uses on ``device``: ``cuda_event`` or ``perf_counter_ns``."""
    return CUDA_EVENTS if device.startswith("cuda") else PERF_COUNTER


def _warm_up(fn: Callable[[], Any], policy: TimingPolicy, synchronize: Callable[[], None]) -> None:
    started = time.perf_counter()
    for _ in range(policy.warmup):
        fn()
        synchronize()
        if time.perf_counter() - started > policy.budget_s:
            break


def _keep_going(done: int, elapsed_s: float, policy: TimingPolicy) -> bool:
    if done >= policy.repeats:
        return False
    return done < min(policy.min_repeats, policy.repeats) or elapsed_s < policy.budget_s


def measure(fn: Callable[[], Any], device: str, policy: TimingPolicy) -> TimingStats:
    """Run ``fn`` per ``policy`` on ``device`` and return the stats of the timed repeats."""
    if device.startswith("cuda"):
        return _measure_cuda(fn, device, policy)
    _warm_up(fn, policy, lambda: None)
    samples: list[float] = []
    started = time.perf_counter()
    while _keep_going(len(samples), time.perf_counter() - started, policy):
        begin = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - begin) / 1e6)
    return TimingStats.from_samples(samples)


def _measure_cuda(fn: Callable[[], Any], device: str, policy: TimingPolicy) -> TimingStats:
    import torch

    dev = torch.device(device)

    def synchronize() -> None:
        torch.cuda.synchronize(dev)

    samples: list[float] = []
    with torch.cuda.device(dev):
        _warm_up(fn, policy, synchronize)
        started = time.perf_counter()
        while _keep_going(len(samples), time.perf_counter() - started, policy):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            synchronize()
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(float(start.elapsed_time(end)))
    return TimingStats.from_samples(samples)
