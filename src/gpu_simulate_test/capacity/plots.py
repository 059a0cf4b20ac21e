"""The capacity curve: predicted latency percentiles against the rate searched (requests/s, or
sessions/s for a multi-turn workload), the goals as horizontal lines, the answer as a vertical
one (matplotlib, Agg backend)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from gpu_simulate_test.capacity.contract import rate_axis
from gpu_simulate_test.io.artifacts import atomic_open

LABELS: Mapping[str, str] = MappingProxyType({"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"})


def plot_capacity(
    frame: pd.DataFrame,
    goals: Mapping[str, float],
    percentile: int,
    answer_qps: float | None,
    path: Path,
    real: pd.DataFrame | None = None,
    measured_qps: float | None = None,
    band_qps: list[float | None] | None = None,
    band_fraction: float = 0.0,
    rate_unit: str = "req/s",
) -> Path:
    """One panel per metric with a goal (or all three without): p50 and the goal's percentile
    against the rate, log x; rates that met every goal drawn filled, the others hollow. With
    ``real`` (a real search's curve), its goal percentile beside, and the measured capacity;
    with ``band_qps`` (the answers with slower and faster steps), that span shaded. Rates are in
    ``rate_unit``."""
    metrics = list(goals) or list(LABELS)
    fig, axes = plt.subplots(1, len(metrics), figsize=(5.0 * len(metrics), 4.0), squeeze=False)
    ok = frame["meets_slo"].astype(bool).to_numpy()
    for ax, metric in zip(axes[0], metrics, strict=True):
        for q, style in ((50, ":"), (percentile, "-")):
            column = f"{metric}_p{q}_ms"
            ax.plot(frame["qps"], frame[column], style, color="C0" if q == 50 else "C1",
                    label=f"p{q}, simulated")  # fmt: skip
            ax.scatter(frame["qps"][ok], frame[column][ok], color="C1" if q != 50 else "C0", s=18)
            ax.scatter(frame["qps"][~ok], frame[column][~ok], facecolors="none",
                       edgecolors="C3", s=18)  # fmt: skip
        if metric in goals:
            ax.axhline(
                goals[metric], color="C3", linestyle="--", label=f"goal {goals[metric]:g} ms"
            )
        if real is not None and len(real):
            column = f"{metric}_p{percentile}_ms"
            met = real["meets_slo"].astype(bool).to_numpy()
            ax.plot(real["qps"], real[column], "-", color="k", label=f"p{percentile}, real engine")
            ax.scatter(real["qps"][met], real[column][met], color="k", marker="s", s=14)
            ax.scatter(real["qps"][~met], real[column][~met], facecolors="none", edgecolors="k",
                       marker="s", s=14)  # fmt: skip
        if band_qps is not None and answer_qps is not None:
            low = band_qps[0] if band_qps[0] is not None else float(frame["qps"].min())
            high = band_qps[1] if band_qps[1] is not None else answer_qps
            ax.axvspan(low, high, color="C2", alpha=0.12,
                       label=f"answers, steps {band_fraction:.0%} slower .. faster")  # fmt: skip
        if answer_qps is not None:
            ax.axvline(
                answer_qps, color="C2", linestyle="-.", label=f"answer {answer_qps:g} {rate_unit}"
            )
        if measured_qps is not None:
            ax.axvline(measured_qps, color="k", linestyle=":",
                       label=f"measured {measured_qps:g} {rate_unit}")  # fmt: skip
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(rate_axis(rate_unit))
        ax.set_ylabel(f"{LABELS[metric]} (ms)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    title = "capacity: simulated latency vs rate (hollow: misses a goal)"
    if real is not None:
        title = "capacity: simulated and real latency vs rate (hollow: misses a goal)"
    fig.suptitle(title, fontsize=10 if len(metrics) == 1 else 12)  # one panel: 5 inches
    fig.tight_layout()
    with atomic_open(path, "wb", encoding=None) as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)
    return path
