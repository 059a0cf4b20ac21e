"""Bound labels and roofline points from ncu's SpeedOfLight and roofline-chart sections.

Rule (``classify_bound``), from the "GPU Speed Of Light Throughput" section:
``compute = Compute (SM) Throughput %`` and ``memory = Memory Throughput %`` (both % of peak);
if both are below ``latency_pct`` (60) the kernel is ``latency-bound``, as ncu's own
``SOLBottleneck`` rule says ("Achieved compute throughput and/or memory bandwidth below 60.0% of
peak typically indicate latency issues"; every decode kernel of the H100 fixture, at most 13 %);
else if they differ by at most ``margin_pct`` percentage points the kernel is ``balanced``,
otherwise it is bound by the larger one, the comparison the same rule makes ("Memory is more
heavily utilized than Compute"); it covers tensor-core work, which the fp32/fp64 roofline chart
does not.

Roofline points (``roofline_points``) come from "GPU Speed Of Light Roofline Chart": peak FLOP/s
= theoretical FMA operations per cycle × SM frequency, peak bandwidth = theoretical DRAM bytes
per cycle × DRAM frequency, achieved FLOP/s = (FMA operations + ADD + MUL per cycle) × SM
frequency, achieved bandwidth = DRAM Bandwidth. A point is memory-bound when its arithmetic
intensity is below the ridge point (peak FLOP/s ÷ peak bandwidth).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, Literal

from gpu_simulate_test.deep_profile.nsight.parsers import NcuReport

Bound = Literal["memory-bound", "compute-bound", "balanced", "latency-bound"]
LATENCY_PCT = 60.0
"""Below this share of peak on both units ncu's ``SOLBottleneck`` rule says latency issues."""
SOL_SECTION = "GPU Speed Of Light Throughput"
ROOFLINE_SECTION = "GPU Speed Of Light Roofline Chart"
_PRECISIONS: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        # precision → (FMA letter, body-item prefix)
        "single": ("F", "Single Precision"),
        "double": ("D", "Double Precision"),
    }
)


@dataclass(frozen=True)
class KernelBound:
    """A kernel's SpeedOfLight utilizations and the label the rule gives it."""

    kernel_id: int
    kernel_name: str
    compute_throughput_pct: float
    memory_throughput_pct: float
    duration_s: float | None
    bound: Bound

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class RooflinePoint:
    """One kernel on one precision's roofline (values in FLOP/s, bytes/s, FLOP/byte)."""

    kernel_id: int
    kernel_name: str
    precision: str
    achieved_flop_s: float
    achieved_bytes_s: float
    peak_flop_s: float
    peak_bytes_s: float

    @property
    def arithmetic_intensity(self) -> float:
        return (
            float("inf")
            if self.achieved_bytes_s == 0
            else self.achieved_flop_s / self.achieved_bytes_s
        )

    @property
    def ridge_point(self) -> float:
        return self.peak_flop_s / self.peak_bytes_s

    @property
    def bound(self) -> Bound:
        return "memory-bound" if self.arithmetic_intensity < self.ridge_point else "compute-bound"

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "arithmetic_intensity": self.arithmetic_intensity,
            "ridge_point": self.ridge_point,
            "bound": self.bound,
        }


def bound_label(
    compute_pct: float,
    memory_pct: float,
    margin_pct: float = 10.0,
    latency_pct: float = LATENCY_PCT,
) -> Bound:
    """The rule above on two utilizations (percent of peak)."""
    if max(compute_pct, memory_pct) < latency_pct:
        return "latency-bound"
    if abs(compute_pct - memory_pct) <= margin_pct:
        return "balanced"
    return "compute-bound" if compute_pct > memory_pct else "memory-bound"


def classify_bound(report: NcuReport, margin_pct: float = 10.0) -> list[KernelBound]:
    """One :class:`KernelBound` per kernel with a SpeedOfLight section, in kernel order."""
    result = []
    for kernel in report.kernels:
        try:
            compute = report.metric("Compute (SM) Throughput", kernel.kernel_id, SOL_SECTION)
            memory = report.metric("Memory Throughput", kernel.kernel_id, SOL_SECTION)
        except KeyError:
            continue
        try:
            duration = report.metric("Duration", kernel.kernel_id, SOL_SECTION).base_value
        except KeyError:
            duration = None
        if compute.value is None or memory.value is None:
            continue
        result.append(
            KernelBound(
                kernel_id=kernel.kernel_id,
                kernel_name=kernel.kernel_name,
                compute_throughput_pct=compute.value,
                memory_throughput_pct=memory.value,
                duration_s=duration,
                bound=bound_label(compute.value, memory.value, margin_pct),
            )
        )
    return result


def roofline_points(report: NcuReport, precision: str = "single") -> list[RooflinePoint]:
    """Kernels placed on the ``single`` or ``double`` precision roofline ncu charted."""
    letter, prefix = _PRECISIONS[precision]
    roof, achieved = f"{prefix} Roofline", f"{prefix} Achieved Value"
    points = []
    for kernel in report.kernels:
        kid = kernel.kernel_id

        def value(name: str, body: str, kernel_id: int = kid) -> float:
            metric = report.metric(name, kernel_id, ROOFLINE_SECTION, body)
            if metric.base_value is None:
                raise KeyError(name)
            return metric.base_value

        try:
            peak_ops_per_cycle = value(f"Theoretical Predicated-On {letter}FMA Operations", roof)
            peak_sm_hz = value("SM Frequency", roof)
            peak_bytes_per_cycle = value("Theoretical DRAM Bytes Accessible", roof)
            dram_hz = value("DRAM Frequency", roof)
            fma_ops = value(f"Predicated-On {letter}FMA Operations Per Cycle", achieved)
            add = value(
                f"Predicated-On {letter}ADD Thread Instructions Executed Per Cycle", achieved
            )
            mul = value(
                f"Predicated-On {letter}MUL Thread Instructions Executed Per Cycle", achieved
            )
            sm_hz = value("SM Frequency", achieved)
            bandwidth = value("DRAM Bandwidth", achieved)
        except KeyError:
            continue
        points.append(
            RooflinePoint(
                kernel_id=kid,
                kernel_name=kernel.kernel_name,
                precision=precision,
                achieved_flop_s=(fma_ops + add + mul) * sm_hz,
                achieved_bytes_s=bandwidth,
                peak_flop_s=peak_ops_per_cycle * peak_sm_hz,
                peak_bytes_s=peak_bytes_per_cycle * dram_hz,
            )
        )
    return points
