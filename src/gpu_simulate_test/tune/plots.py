"""The tune's Pareto plot: each configuration's simulated capacity against its latency at the
shared rate, the frontier drawn; the measured capacities beside where the real engine ran them
(matplotlib, Agg backend)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from gpu_simulate_test.io.artifacts import atomic_open

LABELS: Mapping[str, str] = MappingProxyType({"ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"})
LABEL_STEP = 7
"""Points between labels drawn at one place (configurations that simulate alike)."""
NEAR = (0.15, 0.025)
"""Two points are at one place within this much of a decade of latency and of the highest
capacity."""


def label_rows(xs: list[float], ys: list[float]) -> list[int]:
    """Each point's label row: 0, or one more than the last earlier point drawn at the same
    place (:data:`NEAR`: log latency, capacity over the highest), so that configurations that
    simulate alike (``s32-t128`` beside ``s32-t512``) stack their names instead of printing
    them over each other."""
    top = max((abs(y) for y in ys), default=1.0) or 1.0
    rows: list[int] = []
    for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
        row = 0
        for j in range(i):
            if (
                abs(math.log10(max(x, 1e-9)) - math.log10(max(xs[j], 1e-9))) <= NEAR[0]
                and abs(y - ys[j]) / top <= NEAR[1]
            ):
                row = max(row, rows[j] + 1)
        rows.append(row)
    return rows


def plot_tune(
    frame: pd.DataFrame,
    metric: str,
    percentile: int,
    frontier: list[str],
    objective: str,
    path: Path,
) -> Path:
    """x: ``metric`` at ``percentile`` at the shared rate (``rate_qps``); y: the simulated
    capacity (goodput for ``objective=goodput``); the frontier joined, the best ringed, the
    configured backend a square; measured capacities as black crosses joined to their point."""
    y_col = "capacity_qps" if objective == "capacity" else "goodput_qps"
    shown = frame[(frame["invalid"].fillna("") == "") & frame[y_col].notna()].copy()
    shown = shown[shown[f"{metric}_ms"].notna()]
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    front = shown[shown["config_id"].isin(frontier)].sort_values(f"{metric}_ms")
    ax.scatter(shown[f"{metric}_ms"], shown[y_col], color="C0", s=22, label="configuration")
    if len(front):
        ax.plot(front[f"{metric}_ms"], front[y_col], "-", color="C1", marker="o",
                markersize=5, label="Pareto frontier")  # fmt: skip
    stack = label_rows(shown[f"{metric}_ms"].tolist(), shown[y_col].tolist())
    for k, (_, row) in zip(stack, shown.iterrows(), strict=True):
        ax.annotate(str(row["config_id"]), (row[f"{metric}_ms"], row[y_col]), fontsize=6,
                    xytext=(3, 3 + LABEL_STEP * k), textcoords="offset points")  # fmt: skip
    configured = shown[shown["configured"].astype(bool)]
    if len(configured):
        ax.scatter(configured[f"{metric}_ms"], configured[y_col], marker="s", s=70,
                   facecolors="none", edgecolors="C2", label="configured (backend.*)")  # fmt: skip
    if len(shown):
        best = shown.iloc[0]
        ax.scatter([best[f"{metric}_ms"]], [best[y_col]], s=150, facecolors="none",
                   edgecolors="C3", linewidths=1.5, label=f"best: {best['config_id']}")  # fmt: skip
    real = shown[shown["measured_qps"].notna()] if objective == "capacity" else shown.iloc[0:0]
    for _, row in real.iterrows():
        ax.plot([row[f"{metric}_ms"]] * 2, [row[y_col], row["measured_qps"]], ":", color="k",
                linewidth=0.8)  # fmt: skip
    if len(real):
        ax.scatter(real[f"{metric}_ms"], real["measured_qps"], marker="x", color="k", s=40,
                   label="measured on the real engine")  # fmt: skip
    rate = shown["rate_qps"].dropna()
    at = f" at {float(rate.iloc[0]):g} req/s" if len(rate) and math.isfinite(rate.iloc[0]) else ""
    ax.set_xlabel(f"{LABELS[metric]} p{percentile} (ms, simulated{at})")
    ax.set_ylabel(
        "capacity within the goals (req/s)" if objective == "capacity" else "goodput (req/s)"
    )
    ax.set_xscale("log")  # an overloaded configuration's latency is seconds, a good one's ms
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("tune: throughput against latency, one point per configuration")
    fig.tight_layout()
    with atomic_open(path, "wb", encoding=None) as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)
    return path
