"""PNG plots of a comparison and of a sweep (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.comparison import Comparison
from gpu_simulate_test.io.artifacts import atomic_open

PLOT_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e")
REAL_COLOR, SIM_COLOR = "tab:blue", "tab:orange"
MAX_POINTS = 20_000
"""More requests than this are drawn as an evenly spaced subset (the picture is the same; a
million markers take minutes to render). Statistics always use every request."""


def _thin(size: int) -> np.ndarray:
    """Indices of at most :data:`MAX_POINTS` evenly spaced items of ``size``."""
    if size <= MAX_POINTS:
        return np.arange(size)
    return np.linspace(0, size - 1, MAX_POINTS).round().astype(np.int64)


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    with atomic_open(path, "wb", encoding=None) as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)
    return path


def _ecdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    data = np.sort(values[np.isfinite(values)])
    keep = _thin(data.size)  # exact CDF values at the kept points
    return data[keep], (keep + 1) / max(data.size, 1)


def _truth_band(
    ax: plt.Axes, real: np.ndarray, repeat: np.ndarray, label: str = "real vs real"
) -> None:
    """Shade, at each fraction of requests, between the real run's and its repeat's quantiles:
    the truth's own spread, where a simulation inside it is within the noise."""
    real, repeat = real[np.isfinite(real)], repeat[np.isfinite(repeat)]
    if real.size < 2 or repeat.size < 2:
        return
    q = np.linspace(0.0, 1.0, 101)
    ax.fill_betweenx(
        q, np.quantile(real, q), np.quantile(repeat, q), color=REAL_COLOR, alpha=0.18,
        linewidth=0, label=label,
    )  # fmt: skip


def plot_cdfs(
    comparison: Comparison,
    path: Path,
    title: str,
    repeat: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Empirical CDFs, real vs simulated, of TTFT, TPOT and E2E (ms), on the client's clock;
    with ``repeat`` (each metric of the truth's second run, seconds, the same requests) the
    band between the two real runs: the truth's own spread."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, metric in zip(axes, PLOT_METRICS, strict=True):
        if repeat is not None and metric in repeat:
            real_ms = comparison.joined.real.metric(metric) * 1e3
            _truth_band(ax, real_ms, np.asarray(repeat[metric], dtype=float) * 1e3)
        for label, side, color in (
            ("real", comparison.joined.real, REAL_COLOR),
            ("simulated", comparison.joined.sim, SIM_COLOR),
        ):
            x, y = _ecdf(side.metric(metric) * 1e3)
            ax.step(x, y, where="post", label=label, color=color)
        ax.set_title(f"{m.METRIC_LABELS[metric]} CDF (client clock)")
        ax.set_xlabel(f"{m.METRIC_LABELS[metric]} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")
    fig.suptitle(title)
    return _save(fig, path)


def plot_scatter(comparison: Comparison, path: Path, title: str) -> Path:
    """Per-request predicted vs measured TTFT, TPOT and E2E (ms), with the y = x line."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for ax, metric in zip(axes, PLOT_METRICS, strict=True):
        real = comparison.joined.real.metric(metric) * 1e3
        sim = comparison.joined.sim.metric(metric) * 1e3
        keep = np.isfinite(real) & np.isfinite(sim)
        drawn = np.flatnonzero(keep)
        drawn = drawn[_thin(drawn.size)]
        ax.scatter(real[drawn], sim[drawn], s=12, alpha=0.6, color=SIM_COLOR, label="request")
        if keep.any():
            lo = float(min(real[keep].min(), sim[keep].min()))
            hi = float(max(real[keep].max(), sim[keep].max()))
            ax.plot([lo, hi], [lo, hi], color="black", linestyle="--", label="y = x (exact)")
        ax.set_title(f"{m.METRIC_LABELS[metric]} per request")
        ax.set_xlabel(f"measured {m.METRIC_LABELS[metric]} (ms)")
        ax.set_ylabel(f"simulated {m.METRIC_LABELS[metric]} (ms)")
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left")
    fig.suptitle(title)
    return _save(fig, path)


def plot_error_by_length(comparison: Comparison, path: Path, title: str) -> Path:
    """Per-request relative error (%) against prompt length and against output length."""
    joined = comparison.joined
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6))
    for ax, (label, lengths) in zip(
        axes,
        (
            ("prompt length (tokens)", joined.num_prefill_tokens),
            ("output length (tokens)", joined.num_decode_tokens),
        ),
        strict=True,
    ):
        for metric, marker in zip(PLOT_METRICS, ("o", "s", "^"), strict=True):
            err = comparison.per_request_errors[metric] * 100
            keep = np.flatnonzero(np.isfinite(err))
            keep = keep[_thin(keep.size)]
            ax.scatter(
                lengths[keep], err[keep], s=12, alpha=0.6, marker=marker,
                label=m.METRIC_LABELS[metric],
            )  # fmt: skip
        ax.axhline(0, color="black", linewidth=1)
        ax.set_title(f"error vs {label.split(' (')[0]}")
        ax.set_xlabel(label)
        ax.set_ylabel("simulated / real − 1 (%)")
        ax.grid(alpha=0.3)
        ax.legend(loc="best")
    fig.suptitle(title)
    return _save(fig, path)


def plot_sweep(table: pd.DataFrame, path: Path, x_label: str, stats: Sequence[str]) -> Path:
    """Latency vs the sweep's x (``x_label``), real (solid) vs simulated (dashed), one panel per
    metric, and the error."""
    metrics = [mt for mt in PLOT_METRICS if mt in set(table["metric"])]
    fig, axes = plt.subplots(2, len(metrics), figsize=(5 * len(metrics), 8), squeeze=False)
    for col, metric in enumerate(metrics):
        top, bottom = axes[0][col], axes[1][col]
        for stat, color in zip(
            stats, ("tab:blue", "tab:green", "tab:red", "tab:purple"), strict=False
        ):
            rows = table[(table["metric"] == metric) & (table["stat"] == stat)].sort_values("load")
            top.plot(rows["load"], rows["real_ms"], "-o", color=color, label=f"{stat} real")
            top.plot(rows["load"], rows["sim_ms"], "--x", color=color, label=f"{stat} simulated")
            bottom.plot(rows["load"], rows["signed_rel_error"] * 100, "-o", color=color, label=stat)
        what = x_label.split(" (")[0]
        top.set_title(f"{m.METRIC_LABELS[metric]} vs {what}")
        top.set_xlabel(x_label)
        top.set_ylabel(f"{m.METRIC_LABELS[metric]} (ms)")
        top.grid(alpha=0.3)
        top.legend(fontsize=8)
        bottom.axhline(0, color="black", linewidth=1)
        bottom.set_title(f"{m.METRIC_LABELS[metric]} error vs {what}")
        bottom.set_xlabel(x_label)
        bottom.set_ylabel("simulated / real − 1 (%)")
        bottom.grid(alpha=0.3)
        bottom.legend(fontsize=8)
    return _save(fig, path)


def _token_ticks(ax: plt.Axes, *steps: pd.DataFrame) -> None:
    """Label a token axis at 1, 2, 4, ... up to the largest step (a log axis labelled only at
    powers of ten says little between 10 and 100)."""
    largest = max(
        (int((s["num_prefill_tokens"] + s["num_decode_tokens"]).max()) for s in steps if len(s)),
        default=1,
    )
    ticks = [2**k for k in range(int(np.log2(max(largest, 1))) + 2)]
    ax.set_xticks(ticks, [str(t) for t in ticks], fontsize=8)
    ax.minorticks_off()


def plot_steps(
    real: pd.DataFrame, sim: pd.DataFrame, groups: pd.DataFrame, path: Path, title: str
) -> Path:
    """Engine steps: step time against tokens in the step (real vs simulated, each step a dot),
    and steps per composition group side by side."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 4.6))
    for label, steps, color in (("real", real, REAL_COLOR), ("simulated", sim, SIM_COLOR)):
        keep = _thin(len(steps))
        tokens = (steps["num_prefill_tokens"] + steps["num_decode_tokens"]).to_numpy()[keep]
        left.scatter(
            tokens, steps["elapsed_ms"].to_numpy()[keep], s=8, alpha=0.5, label=label, color=color
        )
    left.set_xscale("symlog", linthresh=8)
    _token_ticks(left, real, sim)
    left.set_xlabel("tokens in the step (prompt + decode)")
    left.set_ylabel("step time (ms)")
    left.set_title("step time by step size")
    left.legend()
    x = np.arange(len(groups))
    right.bar(x - 0.2, groups["real_steps"], 0.4, label="real", color=REAL_COLOR)
    right.bar(x + 0.2, groups["sim_steps"], 0.4, label="simulated", color=SIM_COLOR)
    right.set_xticks(x, groups["group"], rotation=35, ha="right", fontsize=8)
    right.set_ylabel("steps")
    right.set_title("steps per composition")
    right.legend()
    fig.suptitle(title)
    return _save(fig, path)


def plot_ttft_by_turn(rows: Sequence[Mapping[str, Any]], path: Path, title: str) -> Path:
    """TTFT p50 (solid) and p90 (dashed) by turn bucket, real vs simulated, one panel per clock
    (the rows of :func:`gpu_simulate_test.compare.groups.ttft_by_group`)."""
    clocks = list(dict.fromkeys(row["clock"] for row in rows))
    fig, axes = plt.subplots(1, len(clocks), figsize=(6.5 * len(clocks), 4.4), squeeze=False)
    for ax, clock in zip(axes[0], clocks, strict=True):
        mine = [row for row in rows if row["clock"] == clock]
        x = np.arange(len(mine))
        for stat, style in (("p50", "-o"), ("p90", "--^")):
            for label, side, color in (
                ("real", "real", REAL_COLOR),
                ("simulated", "sim", SIM_COLOR),
            ):
                values = [row[f"{side}_{stat}_s"] * 1e3 for row in mine]
                ax.plot(x, values, style, color=color, label=f"{stat} {label}")
        ax.set_xticks(x, [str(row["group"]) for row in mine])
        ax.set_title(f"TTFT by turn, {clock} clock")
        ax.set_xlabel("turn")
        ax.set_ylabel("TTFT (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return _save(fig, path)
