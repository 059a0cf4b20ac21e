"""The real and simulated step sequences side by side: same steps, or where and why not?

Both sides as ``engine_schedule`` tables where they have them (a vLLM run recorded by its own
scheduler; a ``vllm_v1`` simulation), else as ``engine_step_log`` tables (compositions only).
Step ``k`` of one is set against step ``k`` of the other: the **same composition** when both
count the same context requests and tokens and the same generation requests and tokens (vLLM's
own split). The fraction is over the longer sequence, so a simulation with extra or missing
steps cannot score 1. The first step that differs is explained from its requests: which ran on
one side only or with other token counts, and for each whether it had reached the engine when
the other side's step was scheduled, and whether either side preempted there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from gpu_simulate_test.core.engines.step_record import COMPOSITION, parse_requests
from gpu_simulate_test.io.artifacts import atomic_open

KEY = COMPOSITION
DIVERGENCE_REQUESTS = 5
"""Requests named in the first divergence's explanation, at most."""


@dataclass(frozen=True)
class StepAlignment:
    """Step-by-step agreement of two step sequences."""

    source: str
    """``engine_schedule`` (times and requests on both sides) or ``engine_step_log``."""
    real_steps: int
    sim_steps: int
    same_composition_fraction: float
    first_divergence: dict[str, Any] | None
    preemptions: dict[str, int | None]

    def to_dict(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "real_steps": self.real_steps,
            "sim_steps": self.sim_steps,
            "same_composition_fraction": self.same_composition_fraction,
            "first_divergence": self.first_divergence,
            "preemptions": self.preemptions,
        }


def _composition(row: pd.Series) -> dict[str, int]:
    return {col: int(row[col]) for col in KEY}


def _requests(row: pd.Series) -> dict[str, int]:
    return dict(parse_requests(row.get("requests", "")))


def align(
    real: pd.DataFrame,
    sim: pd.DataFrame,
    engine_arrival_s: Mapping[str, float] | None = None,
) -> StepAlignment:
    """Step ``k`` against step ``k``; ``engine_arrival_s`` (by request id, the run clock) lets
    the first divergence say whether a request had reached the engine yet."""
    schedules = "requests" in real.columns and "requests" in sim.columns
    n = min(len(real), len(sim))
    longest = max(len(real), len(sim))
    same = (real[list(KEY)].to_numpy()[:n] == sim[list(KEY)].to_numpy()[:n]).all(axis=1)
    fraction = float(same.sum() / longest) if longest else 1.0
    first = None
    if not same.all() or len(real) != len(sim):
        k = int(np.argmin(same)) if not same.all() else n
        first = _divergence(real, sim, k, engine_arrival_s if schedules else None)

    def preempted(frame: pd.DataFrame) -> int | None:
        return int(frame["num_preempted"].sum()) if "num_preempted" in frame else None

    return StepAlignment(
        source="engine_schedule" if schedules else "engine_step_log",
        real_steps=len(real),
        sim_steps=len(sim),
        same_composition_fraction=fraction,
        first_divergence=first,
        preemptions={"real": preempted(real), "sim": preempted(sim)},
    )


def _divergence(
    real: pd.DataFrame,
    sim: pd.DataFrame,
    k: int,
    arrivals: Mapping[str, float] | None,
) -> dict[str, Any]:
    out: dict[str, Any] = {"step": k}
    if k >= len(real) or k >= len(sim):
        side = "real" if k >= len(real) else "simulated"
        out["why"] = f"the {side} sequence ended after {k} steps; the other went on"
        return out
    r, s = real.iloc[k], sim.iloc[k]
    out["real"], out["sim"] = _composition(r), _composition(s)
    if "requests" not in real.columns or "requests" not in sim.columns:
        out["why"] = "compositions differ (no request lists on both sides to say why)"
        return out
    real_reqs, sim_reqs = _requests(r), _requests(s)
    reasons: list[str] = []
    for label, value in (("real", r), ("simulated", s)):
        if int(value.get("num_preempted", 0) or 0):
            reasons.append(f"the {label} engine preempted {int(value['num_preempted'])} here")
    differing = sorted(
        set(real_reqs) ^ set(sim_reqs)
        | {x for x in set(real_reqs) & set(sim_reqs) if real_reqs[x] != sim_reqs[x]},
        key=lambda x: (not x.isdigit(), int(x) if x.isdigit() else 0, x),
    )
    for rid in differing[:DIVERGENCE_REQUESTS]:
        reasons.append(_request_reason(rid, real_reqs, sim_reqs, r, s, arrivals))
    if len(differing) > DIVERGENCE_REQUESTS:
        reasons.append(f"and {len(differing) - DIVERGENCE_REQUESTS} more request(s) differ")
    out["requests"] = {"real": r["requests"], "sim": s["requests"]}
    out["why"] = "; ".join(reasons) if reasons else "the same requests, other token counts"
    return out


def _apart(gap_ms: float) -> str:
    """How long before (a gap >= 0) or after a step's start a request was queued."""
    return f"{abs(gap_ms):.3f} ms {'before' if gap_ms >= 0 else 'after'}"


def _request_reason(
    rid: str,
    real_reqs: Mapping[str, int],
    sim_reqs: Mapping[str, int],
    r: pd.Series,
    s: pd.Series,
    arrivals: Mapping[str, float] | None,
) -> str:
    where = (
        f"{real_reqs[rid]} tokens in the real step, {sim_reqs[rid]} in the simulated"
        if rid in real_reqs and rid in sim_reqs
        else ("in the real step only" if rid in real_reqs else "in the simulated step only")
    )
    text = f"request {rid}: {where}"
    at = arrivals.get(rid) if arrivals is not None else None
    if at is not None and "start_time_s" in r and "start_time_s" in s:
        real_gap = (float(r["start_time_s"]) - at) * 1000.0
        sim_gap = (float(s["start_time_s"]) - at) * 1000.0
        text += (
            f" (the real engine queued it {_apart(real_gap)} the real step was scheduled, "
            f"{_apart(sim_gap)} the simulated one"
        )
        if (real_gap >= 0) != (sim_gap >= 0):
            text += ": the step clocks differ, not the scheduler"
        elif sim_gap < 0 and rid in sim_reqs:  # the simulated engine had it before its step
            text += ": the simulated way in is shorter than the real one, not the scheduler"
        text += ")"
    return text


def plot_alignment(
    real: pd.DataFrame,
    sim: pd.DataFrame,
    alignment: StepAlignment,
    path: Path,
    title: str,
) -> Path:
    """Tokens and requests per step for both sequences, over time where both have times (else
    by step); below them a strip marking each step k whose composition differs from the
    simulation's step k (where the lines hide it under each other), the first divergence
    marked across all three."""
    timed = "start_time_s" in real.columns and "start_time_s" in sim.columns
    fig, axes = plt.subplots(
        3, 1, figsize=(10, 6.6), sharex=True, gridspec_kw={"height_ratios": [3, 3, 1]}
    )
    for frame, label, color, style in (
        (real, "real", "tab:blue", "-"),
        (sim, "simulated", "tab:orange", "--"),
    ):
        x = frame["start_time_s"].to_numpy(dtype=float) if timed else np.arange(len(frame))
        tokens = frame["num_prefill_tokens"] + frame["num_decode_tokens"]
        size = frame["num_prefill_requests"] + frame["num_decode_requests"]
        axes[0].step(x, tokens, where="post", color=color, linestyle=style, label=label, lw=0.8)
        axes[1].step(x, size, where="post", color=color, linestyle=style, label=label, lw=0.8)
    n = min(len(real), len(sim))
    differ = ~(real[list(KEY)].to_numpy()[:n] == sim[list(KEY)].to_numpy()[:n]).all(axis=1)
    where = real["start_time_s"].to_numpy(dtype=float)[:n] if timed else np.arange(n)
    axes[2].vlines(where[differ], 0, 1, color="tab:red", lw=0.6)
    axes[2].set_yticks([])
    axes[2].set_ylim(0, 1)
    axes[2].set_ylabel("differ", rotation=0, ha="right", va="center")
    axes[2].set_title(
        f"steps whose composition differs: {int(differ.sum())} of {n} (real step k vs "
        "simulated step k)",
        fontsize=9,
        loc="left",
    )
    first = alignment.first_divergence
    if first is not None and first["step"] < len(real):
        at = float(real["start_time_s"].iloc[first["step"]] if timed else first["step"])
        for ax in axes:
            ax.axvline(at, color="tab:red", lw=0.8, alpha=0.7)
        axes[0].text(
            at, 0.97, " first divergence", color="tab:red", fontsize=8, va="top",
            transform=axes[0].get_xaxis_transform(),
        )  # fmt: skip
    axes[0].set_ylabel("tokens in the step")
    axes[1].set_ylabel("requests in the step")
    axes[1].yaxis.set_major_locator(MaxNLocator(integer=True))
    axes[2].set_xlabel("time on the run's clock (s)" if timed else "step")
    axes[0].set_title(
        f"{title}: {alignment.same_composition_fraction:.1%} of steps the same "
        f"({alignment.real_steps} real, {alignment.sim_steps} simulated)"
    )
    axes[0].legend(loc="upper right")
    fig.tight_layout()
    with atomic_open(path, "wb", encoding=None) as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)
    return path


def alignment_markdown(
    alignment: StepAlignment, oracle: Mapping[str, Any] | None, plot: str | None
) -> str:
    """The ``## Step by step`` section of ``summary.md``."""
    lines = [
        "",
        "## Step by step: the same steps as the engine?",
        "",
        f"Step k of the run against step k of the simulation ({alignment.source}): "
        f"**{alignment.same_composition_fraction:.1%}** have the same composition "
        f"({alignment.real_steps} real steps, {alignment.sim_steps} simulated).",
    ]
    pre = alignment.preemptions
    if pre.get("real") is not None or pre.get("sim") is not None:
        lines.append(f"Preemptions: real {pre.get('real')}, simulated {pre.get('sim')}.")
    first = alignment.first_divergence
    if first is not None:
        lines.append(f"First divergence at step {first['step']}: {first['why']}.")
    if oracle:
        lines.append(
            "The simulation is an oracle replay of this run (its engine's arrivals and step "
            f"times: {oracle.get('step_times')}): what differs above is scheduling alone."
        )
    if plot:
        lines += ["", f"![step by step]({plot})"]
    return "\n".join([*lines, ""])
