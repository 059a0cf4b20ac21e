"""MFU, MBU and roofline efficiency of a phase: pure math over measured times and static costs.

Definitions (also in ``docs/deep_profile.md``):

* **MFU** = analytic FLOPs of the phase ÷ (measured time × dense bf16 peak FLOP/s).
* **MBU** = analytic bytes moved ÷ (measured time × memory bandwidth B/s).
* **roofline efficiency** = roofline-bound time (max of compute and memory time) ÷ measured time:
  1.0 means the phase ran as fast as the hardware allows under the static model.

FLOPs and bytes come from :mod:`gpu_simulate_test.deep_profile.static_analysis` (no fusion, weights
read once per step); peaks from :class:`HardwareConfig` (``peak_bf16_tflops`` in 10¹² FLOP/s,
``memory_bandwidth_gb_s`` in 10⁹ B/s).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from gpu_simulate_test.config.schema import HardwareConfig


@dataclass(frozen=True)
class StepTiming:
    """One forward step as measured, with its analytic cost."""

    request_id: int
    phase: str
    """prefill or decode."""
    new_tokens: int
    cached_tokens: int
    duration_s: float
    flops: int
    bytes_moved: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PhaseMetrics:
    """Totals and utilization of one phase over all its steps."""

    phase: str
    num_steps: int
    tokens: int
    time_s: float
    flops: int
    bytes_moved: int
    achieved_tflops: float
    achieved_gb_s: float
    mfu: float
    mbu: float
    roofline_bound_time_s: float
    roofline_efficiency: float
    bound: str
    mean_step_ms: float
    median_step_ms: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def utilization(
    flops: float, bytes_moved: float, time_s: float, hardware: HardwareConfig
) -> dict[str, float]:
    """MFU, MBU, achieved TFLOP/s and GB/s for work done in ``time_s`` seconds on ``hardware``."""
    if time_s <= 0:
        raise ValueError(f"time_s must be > 0, got {time_s}")
    achieved_flop_s = flops / time_s
    achieved_b_s = bytes_moved / time_s
    return {
        "achieved_tflops": achieved_flop_s / 1e12,
        "achieved_gb_s": achieved_b_s / 1e9,
        "mfu": achieved_flop_s / (hardware.peak_bf16_tflops * 1e12),
        "mbu": achieved_b_s / (hardware.memory_bandwidth_gb_s * 1e9),
    }


def phase_metrics(
    steps: Sequence[StepTiming], phase: str, hardware: HardwareConfig
) -> PhaseMetrics | None:
    """Aggregate the steps of ``phase``; None when there are none (e.g. one-token outputs)."""
    chosen = [s for s in steps if s.phase == phase]
    if not chosen:
        return None
    time_s = sum(s.duration_s for s in chosen)
    flops = sum(s.flops for s in chosen)
    bytes_moved = sum(s.bytes_moved for s in chosen)
    util = utilization(flops, bytes_moved, time_s, hardware)
    # per step, the roofline bound is max(compute, memory); the phase bound is their sum
    peak_flop_s = hardware.peak_bf16_tflops * 1e12
    bandwidth_b_s = hardware.memory_bandwidth_gb_s * 1e9
    compute_s = sum(s.flops / peak_flop_s for s in chosen)
    memory_s = sum(s.bytes_moved / bandwidth_b_s for s in chosen)
    bound_s = sum(max(s.flops / peak_flop_s, s.bytes_moved / bandwidth_b_s) for s in chosen)
    durations_ms = [s.duration_s * 1e3 for s in chosen]
    return PhaseMetrics(
        phase=phase,
        num_steps=len(chosen),
        tokens=sum(s.new_tokens for s in chosen),
        time_s=time_s,
        flops=flops,
        bytes_moved=bytes_moved,
        achieved_tflops=util["achieved_tflops"],
        achieved_gb_s=util["achieved_gb_s"],
        mfu=util["mfu"],
        mbu=util["mbu"],
        roofline_bound_time_s=bound_s,
        roofline_efficiency=bound_s / time_s,
        bound="compute" if compute_s >= memory_s else "memory",
        mean_step_ms=statistics.fmean(durations_ms),
        median_step_ms=statistics.median(durations_ms),
    )


def serving_summary(steps: Sequence[StepTiming]) -> dict[str, float | int]:
    """Throughput and latency of the sequential pass (no queueing: one request at a time).

    TTFT = the request's prefill step; TPOT = its mean decode step (first token excluded);
    throughput = output tokens ÷ total step time.
    """
    by_request: dict[int, list[StepTiming]] = {}
    for step in steps:
        by_request.setdefault(step.request_id, []).append(step)
    ttfts = [s.duration_s for s in steps if s.phase == "prefill"]
    tpots = [
        statistics.fmean(d.duration_s for d in req if d.phase == "decode")
        for req in by_request.values()
        if any(d.phase == "decode" for d in req)
    ]
    total_s = sum(s.duration_s for s in steps)
    # each prefill yields the first output token, each decode step one more
    output_tokens = len(ttfts) + sum(1 for s in steps if s.phase == "decode")
    prompt_tokens = sum(s.new_tokens for s in steps if s.phase == "prefill")
    return {
        "num_requests": len(by_request),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "total_step_time_s": total_s,
        "output_throughput_tokens_per_s": output_tokens / total_s if total_s > 0 else 0.0,
        "total_throughput_tokens_per_s": (
            (prompt_tokens + output_tokens) / total_s if total_s > 0 else 0.0
        ),
        "mean_ttft_ms": statistics.fmean(ttfts) * 1e3 if ttfts else float("nan"),
        "mean_tpot_ms": statistics.fmean(tpots) * 1e3 if tpots else float("nan"),
    }
