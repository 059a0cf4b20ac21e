"""What besides a step's composition moves its time, shown: the rank correlation of each
candidate (:data:`~.serving_load.CANDIDATES`) with the steps' ratio, the report of the fitted
serving terms, and the residual plot (the bundle's ``step_residuals.png``, the simulation's)."""

from __future__ import annotations

import itertools
from dataclasses import asdict
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.serving_load import (
    AXIS_LABELS,
    CANDIDATES,
    ServingLoad,
    modelled_s,
)


def _spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return None
    rx = pd.Series(x).rank().to_numpy()
    ry = pd.Series(y).rank().to_numpy()
    return float(np.corrcoef(rx, ry)[0, 1])


def _candidate(features: pd.DataFrame, name: str) -> np.ndarray:
    """A candidate's values (NaN where the steps do not have it: sends before version 12)."""
    if name not in features.columns:
        return np.full(len(features), np.nan)
    return features[name].to_numpy(dtype=float)


def residual_analysis(features: pd.DataFrame, ratio: np.ndarray) -> list[dict[str, Any]]:
    """Per candidate: the rank correlation of the steps' ratio (measured over the model) with it,
    and the mean ratio in its lowest and highest fifth (over steps where it varies)."""
    ratio = np.asarray(ratio, dtype=float)
    out = []
    for name, what in CANDIDATES.items():
        x = _candidate(features, name)
        keep = np.isfinite(x) & np.isfinite(ratio)
        x, y = x[keep], ratio[keep]
        row: dict[str, Any] = {"candidate": name, "what": what, "steps": len(x)}
        row["spearman"] = _spearman(x, y)
        if len(x) >= 10 and np.ptp(x) > 0:
            lo, hi = np.quantile(x, [0.2, 0.8])
            row["mean_ratio_low"] = float(np.mean(y[x <= lo]))
            row["mean_ratio_high"] = float(np.mean(y[x >= hi]))
        out.append(row)
    return out


def report(
    load: ServingLoad,
    features: pd.DataFrame,
    predicted_s: np.ndarray,
    calibrated_on: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """What ``run_meta.json`` says: the terms, the steps behind them, the residual analysis
    before and after the terms, and which runs calibrated them."""
    pred = np.asarray(predicted_s, dtype=float)
    known = np.isfinite(pred)
    features, pred = features[known].reset_index(drop=True), pred[known]
    body = features["body_s"].to_numpy(dtype=float)
    modelled = modelled_s(load, features, pred)
    return {
        "terms": _terms(load),
        "steps": len(features),
        "steps_without_prediction": int((~known).sum()),
        "busy_steps": int(features["busy"].sum()),
        "mean_ratio": {
            "composition_only": float(np.nanmean(body / pred)),
            "with_serving_terms": float(np.nanmean(body / modelled)),
        },
        "total_time_ratio": {
            "composition_only": float(np.sum(pred) / np.sum(body)),
            "with_serving_terms": float(np.sum(modelled) / np.sum(body)),
        },
        "residuals": residual_analysis(features, body / pred),
        "calibrated_on": calibrated_on or {},
    }


def plot_residuals(
    features: pd.DataFrame, ratio: np.ndarray, path: Any, title: str, model: str
) -> None:
    """One panel per candidate: each step's ratio over ``model`` against it, with the mean per
    bin."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpu_simulate_test.io.artifacts import atomic_path

    names = list(CANDIDATES)
    fig, axes = plt.subplots(2, 4, figsize=(16, 7), constrained_layout=True)
    ratio = np.asarray(ratio, dtype=float)
    for ax in axes.flat[len(names) :]:
        ax.axis("off")
    for ax, name in zip(axes.flat, names, strict=False):
        x = _candidate(features, name)
        keep = np.isfinite(x) & np.isfinite(ratio)
        x, y = x[keep], ratio[keep]
        log = name == "idle_ms"
        if log:
            idle = x > 0
            x, y = x[idle], y[idle]
            ax.set_xscale("log")
        ax.scatter(x, y, s=4, alpha=0.25, color="tab:blue", rasterized=True)
        if len(x) >= 10 and np.ptp(x) > 0:
            edges = np.unique(np.quantile(x, np.linspace(0, 1, 9)))
            mids, means = [], []
            for a, b in itertools.pairwise(edges):
                inside = (x >= a) & (x <= b)
                if inside.any():
                    mids.append(float(np.median(x[inside])))
                    means.append(float(np.mean(y[inside])))
            ax.plot(mids, means, "o-", color="tab:red", label="mean per bin")
            ax.legend(loc="upper left", fontsize=8)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xlabel(AXIS_LABELS[name])
        ax.set_ylabel(f"measured step time / {model} (ratio)")
        ax.set_ylim(0.5, 2.5)
    fig.suptitle(title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def _terms(load: ServingLoad) -> dict[str, Any]:
    """The terms as ``run_meta.json`` keeps them: the wake-ups' residuals by their count and
    deciles, not one by one."""
    terms = asdict(load)
    residual = np.asarray(terms.pop("wake_residual_ms"), dtype=float)
    terms["wake_residual_ms"] = (
        {"n": len(residual), **{f"p{q}": float(np.percentile(residual, q)) for q in (10, 50, 90)}}
        if len(residual)
        else None
    )
    terms["busy_residual"] = [  # per band of decodes: its steps and log residual's deciles
        {"n": len(v), **{f"p{q}": float(np.percentile(v, q)) for q in (10, 50, 90, 99)}}
        for v in terms.pop("busy_residual")
    ] or None
    return terms
