"""The fidelity report's verdict, its first lines: per backend and clock, how many rows are within
the truth's own spread, the rows furthest outside it, whether the error is one-signed (a model
gap) or two-signed, and whether the truth was disturbed.

A row (a metric's p50 or p90 at one load, on one clock) is within the noise when the
simulation's error is at most ``max(10%, |real vs real|)`` (the load's repeat on the same clock;
10% without one), as the comparison's verdict judges (:mod:`gpu_simulate_test.compare.verdict`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare.verdict import NOISE_FLOOR

SHOWN_OUTSIDE = 3
"""Rows named outside the noise per backend and clock, furthest first."""


def judged(table: pd.DataFrame) -> pd.DataFrame:
    """The finite rows with their band (``max(10%, |noise|)``) and ``within``."""
    rows = table[np.isfinite(table["rel_error"].astype(float))].copy()
    if "clock" not in rows.columns:
        rows["clock"] = "client"
    noise = rows["noise"].astype(float) if "noise" in rows.columns else np.nan
    rows["band"] = np.fmax(NOISE_FLOOR, np.abs(noise))
    rows["band"] = rows["band"].fillna(NOISE_FLOOR)
    rows["within"] = np.abs(rows["rel_error"].astype(float)) <= rows["band"]
    return rows


def sign_word(errors: np.ndarray) -> str:
    """``one-signed (every row too slow)`` / ``... too fast`` or ``two-signed``."""
    if errors.size and (errors > 0).all():
        return "one-signed: every row too slow"
    if errors.size and (errors < 0).all():
        return "one-signed: every row too fast"
    return "two-signed"


def _row(row: Any) -> str:
    noise = getattr(row, "noise", np.nan)
    rr = f"real vs real {noise:+.1%}" if np.isfinite(noise) else "no repeat"
    return (
        f"{str(row.metric).upper()} {row.stat} at {row.load_fraction:.0%} {row.rel_error:+.1%} "
        f"({rr})"
    )


def verdict_lines(table: pd.DataFrame, real_runs: Sequence[Mapping[str, Any]] | None) -> list[str]:
    """The verdict's lines (a list): one per backend and clock, then the truth."""
    if table.empty:
        return ["- **Verdict:** no row to judge.", ""]
    rows = judged(table)
    lines = []
    for (backend, clock), part in rows.groupby(["backend", "clock"], sort=False):
        errors = part["rel_error"].astype(float).to_numpy()
        outside = part[~part["within"]].assign(
            excess=lambda f: np.abs(f["rel_error"].astype(float)) - f["band"]
        )
        worst = outside.sort_values("excess", ascending=False).head(SHOWN_OUTSIDE)
        said = "; ".join(_row(r) for r in worst.itertuples())
        more = len(outside) - len(worst)
        tail = f"; and {more} more" if more > 0 else ""
        lines.append(
            f"- **Verdict, {backend}, {clock} clock:** {int(part['within'].sum())} of {len(part)} "
            f"rows within max(10%, real vs real); mean signed {np.mean(errors):+.1%}, "
            f"{sign_word(errors)}" + (f". Outside: {said}{tail}." if said else ".")
        )
        lines += at_level_line(part)
    lines.append(truth_line(real_runs))
    return [*lines, ""]


def at_level_line(part: pd.DataFrame) -> list[str]:
    """The same rows simulated at their real runs' own step level (a diagnosis beside the
    verdict, which judges the simulation as calibrated); nothing without it."""
    if "rel_error_at_level" not in part.columns:
        return []
    errors = part["rel_error_at_level"].astype(float).to_numpy()
    finite = np.isfinite(errors)
    if not finite.any():
        return []
    within = int((np.abs(errors[finite]) <= part["band"].to_numpy()[finite]).sum())
    return [
        f"  - at the real runs' own step level (a diagnosis: the model's error once the host's "
        f"speed is known): {within} of {int(finite.sum())} within; mean signed "
        f"{np.mean(errors[finite]):+.1%}, {sign_word(errors[finite])}."
    ]


def load_name(fraction: float | None) -> str:
    """A real run's load in words: ``at 50%``, or the capacity probe (``None``)."""
    return "capacity probe" if fraction is None else f"at {fraction:.0%}"


def truth_line(real_runs: Sequence[Mapping[str, Any]] | None) -> str:
    """Whether the real runs were disturbed, in one line."""
    if real_runs is None:
        return "- **Truth:** not checked for disturbance (see Real runs)."
    kept = [r for r in real_runs if r.get("disturbed")]
    redone = sum(int(r.get("reruns") or 0) for r in real_runs)
    again = f"; {redone} disturbed run(s) re-run" if redone else ""
    if not kept:
        return f"- **Truth:** all {len(real_runs)} real runs undisturbed{again}."
    where = ", ".join(f"{r['backend']} {load_name(r['load_fraction'])}" for r in kept)
    return (
        f"- **Truth: DISTURBED** at {where} (kept after every re-run{again}): those rows measure "
        "the host as much as the engine (see Real runs)."
    )
