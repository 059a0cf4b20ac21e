"""Engine steps, real against simulated: does the error come from step time or from scheduling?

Both sides are ``engine_step_log`` tables: a vLLM server's own per-step log and Vidur's batches.
Steps are grouped by composition (decode-only steps by batch size, steps with prompt tokens by
tokens in the step); per group, how many steps each side took and their median time.

- **Step time**: for the real steps' mix of compositions, how much slower or faster Vidur's steps
  of the same composition are (each group's median time, weighted by the real step count).
- **Scheduling**: whether Vidur ran as many steps of the same shapes (step count, batch size and
  tokens per step); a scheduler that batches differently shows here even with exact step times.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare.metrics import relative_error
from gpu_simulate_test.core.engines.vllm_log import step_cost_ms
from gpu_simulate_test.core.metrics import percentiles as pct
from gpu_simulate_test.core.reporting import markdown_table

DECODE_BUCKETS: tuple[tuple[int, int], ...] = (
    (1, 1),
    (2, 4),
    (5, 8),
    (9, 16),
    (17, 32),
    (33, 10**9),
)
"""Requests in a decode-only step."""
PREFILL_BUCKETS: tuple[tuple[int, int], ...] = ((1, 64), (65, 128), (129, 256), (257, 10**9))
"""Tokens in a step that carries prompt tokens (prefill or mixed)."""


def _label(kind: str, lo: int, hi: int) -> str:
    unit = "requests" if kind == "decode" else "tokens"
    if lo == hi:
        return f"{kind} {lo} {unit[:-1] if lo == 1 else unit}"
    if hi >= 10**9:
        return f"{kind} {lo}+ {unit}"
    return f"{kind} {lo}–{hi} {unit}"


def step_group(steps: pd.DataFrame) -> pd.Series:
    """Each step's composition group (``decode 5–8 requests``, ``prefill 65–128 tokens``...)."""
    size = steps["num_prefill_requests"] + steps["num_decode_requests"]
    tokens = steps["num_prefill_tokens"] + steps["num_decode_tokens"]
    has_prefill = steps["num_prefill_tokens"] > 0
    out = pd.Series("", index=steps.index, dtype=object)
    for lo, hi in DECODE_BUCKETS:
        out[~has_prefill & size.between(lo, hi)] = _label("decode", lo, hi)
    for lo, hi in PREFILL_BUCKETS:
        out[has_prefill & tokens.between(lo, hi)] = _label("prefill", lo, hi)
    return out


GROUP_COLUMNS: tuple[str, ...] = (
    "group",
    "real_steps",
    "sim_steps",
    "real_median_ms",
    "real_engine_median_ms",
    "sim_median_ms",
    "rel_error",
)


def _order() -> list[str]:
    return [_label("decode", lo, hi) for lo, hi in DECODE_BUCKETS] + [
        _label("prefill", lo, hi) for lo, hi in PREFILL_BUCKETS
    ]


@dataclass(frozen=True)
class StepComparison:
    """Per-group table and the two headline attributions."""

    groups: pd.DataFrame
    """:data:`GROUP_COLUMNS`: steps per side, the real steps' median full cost and median of
    the engine's own step time, the simulated median, and the error of the full cost."""
    totals: dict[str, Any]
    findings: list[str] = field(default_factory=list)


SHAPE_STATS: tuple[str, ...] = pct.names((50, 90))
"""Percentiles of batch size and tokens per step in the totals, from the one list
(:data:`gpu_simulate_test.core.metrics.percentiles.PERCENTILES`)."""


def _median(values: pd.Series) -> float:
    """Median of the finite values (:func:`gpu_simulate_test.core.metrics.percentiles.describe`),
    NaN without any."""
    return pct.describe(values.to_numpy(dtype=float)).median


def _side_totals(steps: pd.DataFrame) -> dict[str, float]:
    size = pct.describe(steps["num_prefill_requests"] + steps["num_decode_requests"])
    tokens = pct.describe(steps["num_prefill_tokens"] + steps["num_decode_tokens"])
    return {
        "steps": len(steps),
        "busy_ms": float(steps["cost_ms"].sum()),
        "prefill_tokens": int(steps["num_prefill_tokens"].sum()),
        "decode_tokens": int(steps["num_decode_tokens"].sum()),
        **{f"batch_size_{s}": size.stat(s) for s in SHAPE_STATS},
        **{f"tokens_per_step_{s}": tokens.stat(s) for s in SHAPE_STATS},
        "median_step_ms": _median(steps["elapsed_ms"]),
    }


def _rel(sim: float, real: float) -> float:
    return sim / real - 1.0 if real and np.isfinite(real) and np.isfinite(sim) else float("nan")


def compare_steps(
    real: pd.DataFrame,
    sim: pd.DataFrame,
    queue_ms: Mapping[str, Any] | None = None,
    ttft_ms: Mapping[str, float | None] | None = None,
) -> StepComparison:
    """Line up the real engine's steps with Vidur's batches (``engine_step_log`` tables).

    A real step's time is its full cost (:func:`step_cost_ms`: the engine's own time plus its
    loop around the step), which is what a simulated batch stands for."""
    cost, loop = step_cost_ms(real)
    real = real.assign(group=step_group(real), cost_ms=cost)
    sim = sim.assign(group=step_group(sim), cost_ms=sim["elapsed_ms"])
    rows = []
    for name in _order():
        r = real.loc[real["group"] == name]
        s = sim.loc[sim["group"] == name, "cost_ms"]
        if r.empty and s.empty:
            continue
        r_med = _median(r["cost_ms"])
        s_med = _median(s)
        rows.append(
            {
                "group": name,
                "real_steps": len(r),
                "sim_steps": len(s),
                "real_median_ms": r_med,
                "real_engine_median_ms": _median(r["elapsed_ms"]),
                "sim_median_ms": s_med,
                "rel_error": _rel(s_med, r_med),
            }
        )
    groups = pd.DataFrame(rows, columns=GROUP_COLUMNS)
    both = groups.dropna(subset=["real_median_ms", "sim_median_ms"])
    weights = both["real_steps"].to_numpy(dtype=float)
    real_time = float((weights * both["real_median_ms"]).sum())
    step_time_error = (
        float((weights * both["sim_median_ms"]).sum()) / real_time - 1.0 if real_time else np.nan
    )
    totals: dict[str, Any] = {
        "real": _side_totals(real),
        "sim": _side_totals(sim),
        "step_time_error": step_time_error,
        "steps_covered": int(weights.sum()),
        "engine_loop_ms": loop,
    }
    totals["step_count_error"] = _rel(totals["sim"]["steps"], totals["real"]["steps"])
    totals["busy_time_error"] = _rel(totals["sim"]["busy_ms"], totals["real"]["busy_ms"])
    if queue_ms:
        totals["queue_ms"] = dict(queue_ms)
    if ttft_ms:
        totals["ttft_ms"] = dict(ttft_ms)
    return StepComparison(groups, totals, step_findings(groups, totals))


def step_findings(groups: pd.DataFrame, totals: Mapping[str, Any]) -> list[str]:
    """Plain sentences: where the error lives (step time or scheduling), and the worst groups."""
    real, sim = totals["real"], totals["sim"]
    out = []
    err = totals["step_time_error"]
    if np.isfinite(err):
        out.append(
            f"step time: for the same step compositions, simulated steps take {err:+.0%} "
            f"(median per group, weighted by the {totals['steps_covered']} real steps)"
        )
    out.append(
        f"scheduling: {sim['steps']} simulated steps vs {real['steps']} real "
        f"({totals['step_count_error']:+.0%}); batch size p50/p90 {sim['batch_size_p50']:.0f}/"
        f"{sim['batch_size_p90']:.0f} vs {real['batch_size_p50']:.0f}/{real['batch_size_p90']:.0f}"
        f"; tokens per step p90 {sim['tokens_per_step_p90']:.0f} vs "
        f"{real['tokens_per_step_p90']:.0f}"
    )
    out.append(
        f"busy time: {sim['busy_ms'] / 1000:.2f} s simulated vs {real['busy_ms'] / 1000:.2f} s "
        f"real ({totals['busy_time_error']:+.0%})"
    )
    if totals.get("engine_loop_ms"):
        out.append(
            f"engine loop outside the timed step: {totals['engine_loop_ms']:.2f} ms per step "
            "(median gap between back-to-back steps' log lines minus the step's own time); "
            "included in the real step times above"
        )
    worst = groups.dropna(subset=["rel_error"])
    worst = worst[worst["real_steps"] >= 5]
    if not worst.empty:
        row = worst.iloc[int(np.argmax(worst["rel_error"].abs().to_numpy()))]
        out.append(
            f"largest step-time gap: {row['group']} ({row['real_steps']} real steps), "
            f"{row['sim_median_ms']:.2f} ms simulated vs {row['real_median_ms']:.2f} ms "
            f"({row['rel_error']:+.0%})"
        )
    queue = totals.get("queue_ms") or {}
    if queue.get("real") is not None and queue.get("sim") is not None:
        source = queue.get("source", "the server's own count")
        out.append(
            f"time queued before the first step, mean: {queue['sim']:.2f} ms simulated vs "
            f"{queue['real']:.2f} ms real ({source})"
        )
    if (line := ttft_finding(totals.get("ttft_ms") or {})) is not None:
        out.append(line)
    return out


def ttft_finding(ttft: Mapping[str, float | None]) -> str | None:
    """The mean TTFT on both clocks and the front end (client − engine) on both sides, the same
    span; a comparison from before the engine-clock means (no ``engine``) against the server's
    own TTFT metric and the calibrated front end, as it was written then."""
    client, sim = ttft.get("client"), ttft.get("sim")
    if client is None or sim is None:
        return None
    engine, sim_engine = ttft.get("engine"), ttft.get("sim_engine")
    if engine is not None and sim_engine is not None:
        real_fe, sim_fe = client - engine, sim - sim_engine
        error = relative_error(sim_fe, real_fe) if real_fe > 0 else float("nan")
        return (
            f"TTFT, mean: {client:.1f} ms at the client, {engine:.1f} ms on the engine's own "
            f"clock; simulated {sim:.1f} and {sim_engine:.1f} ms; the front end (client − "
            f"engine: HTTP, the API server, streaming, the client) {real_fe:.1f} ms real, "
            f"{sim_fe:.1f} ms simulated ({'–' if np.isnan(error) else f'{error:+.0%}'})"
        )
    server, modelled = ttft.get("server"), ttft.get("sim_frontend")
    if server is None:
        return None
    return (
        f"TTFT, mean: {client:.1f} ms at the client, {server:.1f} ms on the "
        f"server's own clock, {sim:.1f} ms simulated; "
        f"{client - server:.1f} ms of each first token is spent outside the "
        "server (HTTP, streaming, the client), "
        + (
            "which Vidur does not model"
            if modelled is None
            else f"against {modelled:.1f} ms of calibrated front end in the simulation"
        )
    )


def markdown_rows(groups: pd.DataFrame) -> Sequence[Sequence[str]]:
    """The group table as markdown cells."""

    def ms(v: float) -> str:
        return "–" if not np.isfinite(v) else f"{v:.2f}"

    def err(v: float) -> str:
        return "–" if not np.isfinite(v) else f"{v:+.1%}"

    return [
        [
            str(r["group"]),
            str(r["real_steps"]),
            str(r["sim_steps"]),
            ms(r["real_median_ms"]),
            ms(r["real_engine_median_ms"]),
            ms(r["sim_median_ms"]),
            err(r["rel_error"]),
        ]
        for _, r in groups.iterrows()
    ]


def steps_markdown(result: StepComparison, plot: str | None = None) -> str:
    """The ``## Engine steps`` section of ``summary.md`` (with ``plot``: the steps' figure,
    relative to the run)."""
    lines = [
        "",
        "## Engine steps: step time or scheduling?",
        "",
        "The real engine's own per-step log against Vidur's batches, grouped by composition "
        "(decode-only steps by requests, steps with prompt tokens by tokens in the step). A "
        "real step's time is its full cost: the engine's timed step plus its loop around it "
        "(the gap between back-to-back steps' log lines).",
        "",
        *(f"- {line}" for line in result.findings),
        "",
        markdown_table(
            [
                "group",
                "real steps",
                "simulated steps",
                "real median (ms)",
                "of which the engine's timed step (ms)",
                "sim median (ms)",
                "error",
            ],
            markdown_rows(result.groups),
        ),
        "",
    ]
    if plot is not None:
        lines += [f"![engine steps]({plot})", ""]
    return "\n".join(lines)
