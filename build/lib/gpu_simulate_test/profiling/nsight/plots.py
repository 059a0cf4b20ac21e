"""Roofline scatter of ncu kernels (matplotlib, Agg backend; no display needed)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpu_simulate_test.deep_profile.nsight.classify import RooflinePoint


def short_kernel_name(name: str, width: int = 40) -> str:
    """A kernel name cut to its leading identifier, for legends."""
    head = name.split("(")[0].split("<")[0].strip() or name
    return head if len(head) <= width else head[: width - 1] + "…"


def plot_roofline(points: Sequence[RooflinePoint], path: str | Path, title: str = "") -> Path:
    """Draw the points on log-log axes under their roof (min(peak, AI × bandwidth)); a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    if not points:
        raise ValueError("plot_roofline: no points to draw")
    out = Path(path)
    fig, ax = plt.subplots(figsize=(7, 5))
    try:
        intensities = [p.arithmetic_intensity for p in points]
        ridge = max(p.ridge_point for p in points)
        lo = min(min(intensities), ridge) / 10
        hi = max(max(intensities), ridge) * 10
        grid = np.logspace(np.log10(lo), np.log10(hi), 200)
        roofs = {(p.peak_flop_s, p.peak_bytes_s) for p in points}
        for peak_flop_s, peak_bytes_s in sorted(roofs):
            ax.plot(grid, np.minimum(peak_flop_s, grid * peak_bytes_s), color="black", lw=1)
        for p in points:
            marker = "o" if p.bound == "memory-bound" else "s"
            ax.scatter(
                p.arithmetic_intensity,
                p.achieved_flop_s,
                marker=marker,
                label=f"{p.kernel_id}: {short_kernel_name(p.kernel_name)} ({p.bound})",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP/byte, DRAM)")
        ax.set_ylabel("achieved FLOP/s")
        ax.set_title(title or f"roofline ({points[0].precision} precision)")
        ax.legend(fontsize=7, loc="lower right")
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    finally:
        plt.close(fig)
    return out
