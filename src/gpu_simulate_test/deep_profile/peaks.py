"""The CPU's peaks, measured: a GPU's datasheet peaks are facts, a CPU's config numbers guesses.

A short probe (well under a second) times a large copy (memory bandwidth, bytes read plus bytes
written) and a square fp32 matmul (FLOP rate) on the threads torch uses, best of a few repeats.
MFU and MBU of a CPU run are taken against these, so they say how close the run came to what
this host does, not to a number in a YAML file.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_simulate_test.config.schema import HardwareConfig

COPY_BYTES = 256 * 2**20
"""Large enough to leave every cache level."""
MATMUL_N = 1024
REPEATS = 3


@dataclass(frozen=True)
class MeasuredPeaks:
    """What the probe measured (decimal units, as the hardware configs use)."""

    memory_bandwidth_gb_s: float
    peak_tflops: float
    threads: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": "measured",
            "memory_bandwidth_gb_s": self.memory_bandwidth_gb_s,
            "peak_tflops": self.peak_tflops,
            "threads": self.threads,
            "probe": f"copy of {COPY_BYTES // 2**20} MiB and a {MATMUL_N}^3 fp32 matmul, best of "
            f"{REPEATS}",
        }


def _best_s(work: Any) -> float:
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        work()
        best = min(best, time.perf_counter() - start)
    return best


def host_peaks(hardware: HardwareConfig) -> tuple[HardwareConfig, dict[str, Any]]:
    """``hardware`` with its peaks as this host measured them when it is a CPU (a GPU's are
    kept), and the record of where they came from (``source``: config or measured)."""
    if hardware.device.startswith("cuda"):
        return hardware, {"source": "config"}
    measured = measure_cpu_peaks()
    adjusted = dataclasses.replace(
        hardware,
        peak_bf16_tflops=measured.peak_tflops,
        memory_bandwidth_gb_s=measured.memory_bandwidth_gb_s,
    )
    return adjusted, measured.to_dict()


def flop_peak_basis(peaks: Mapping[str, Any] | None) -> str:
    """Which FLOP peak ``hardware.peak_bf16_tflops`` holds, given the record of
    :func:`host_peaks`: the config's dense bf16 peak, or (a CPU) this host's fp32 matmul rate."""
    if peaks and peaks.get("source") == "measured":
        return "fp32 matmul rate measured on this host"
    return "dense bf16 peak from the hardware config"


@functools.lru_cache(maxsize=1)
def measure_cpu_peaks() -> MeasuredPeaks:
    """Copy bandwidth and matmul FLOP rate of this CPU, with torch's threads (probed once per
    process: the static analysis and the torch profiler step share it)."""
    import torch

    src = torch.ones(COPY_BYTES // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # fault the pages in before timing
    copy_s = _best_s(lambda: dst.copy_(src))
    a = torch.rand(MATMUL_N, MATMUL_N)
    b = torch.rand(MATMUL_N, MATMUL_N)
    torch.mm(a, b)
    mm_s = _best_s(lambda: torch.mm(a, b))
    return MeasuredPeaks(
        memory_bandwidth_gb_s=2 * COPY_BYTES / copy_s / 1e9,
        peak_tflops=2 * MATMUL_N**3 / mm_s / 1e12,
        threads=torch.get_num_threads(),
    )
