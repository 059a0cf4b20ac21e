"""The first token's parts (:mod:`.ttft_parts`) in ``summary.md`` and ``ttft_parts.png``: each
says which stamps split them (the API server's hops, or an in-process engine's own)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import send_state
from gpu_simulate_test.compare.ttft_parts import ENGINE_HOP, PARTS, SOURCES, STATS, Source
from gpu_simulate_test.core.reporting import markdown_table


def hops_text(numbers: Sequence[int]) -> str:
    """``hop 3``, ``hops 4 and 5``, ``hops 1, 2, 4 and 5``."""
    said = [str(n) for n in numbers]
    if len(said) == 1:
        return f"hop {said[0]}"
    return f"hops {', '.join(said[:-1])} and {said[-1]}"


def hop_numbers(source: Source, names: Sequence[str]) -> list[int]:
    """The 1-based positions of ``names`` among ``source``'s hops."""
    order = [name for name, _, _ in source.hops]
    return [order.index(name) + 1 for name in names]


def ttft_parts_markdown(record: Mapping[str, Any] | None, plot: str | None) -> str:
    """The ``## Where the first token's time goes`` section of ``summary.md``."""
    if record is None:
        return ""
    source = SOURCES[record["source"]]
    rows = [
        [
            str(p["hop"]),
            *(f"{p[s]:.2f}" for s in STATS),
            f"{100 * p['share_of_mean']:.0f}%" if p["share_of_mean"] is not None else "–",
            str(p["below_zero"]),
        ]
        for p in record["hops"]
    ]
    lines = [
        "",
        "## Where the first token's time goes (real, ms)",
        "",
        f"*Source:* {source.label} (`ttft_parts.source`: `{source.name}`). Each of "
        f"{record['requests']} requests' client TTFT split into its hops by {source.stamps}; "
        "the hops add up to the client TTFT. *Below zero*: requests where two clocks disagree "
        "by more than the hop.",
        "",
        markdown_table(["hop", *STATS, "share of the mean", "below zero"], rows),
    ]
    front = record.get("front_end") or {}
    if front:
        said = ", ".join(
            f"{stat} {v['real_ms']:.1f} real / {v['sim_ms']:.1f} simulated"
            + (f" (the truth's repeat {v['repeat_ms']:.1f})" if "repeat_ms" in v else "")
            for stat, v in front.items()
        )
        outside = [name for name, _, _ in source.hops if name != ENGINE_HOP]
        lines += [
            "",
            f"The simulation's front end is {hops_text(hop_numbers(source, outside))} together "
            f"(client − engine TTFT): {said} ms.",
        ]
    simulated = record.get("simulated") or []
    if simulated:
        rows = [
            [
                str(p["part"]),
                *(f"{p[f'real_{s}']:.2f} / {p[f'sim_{s}']:.2f}" for s in ("p50", "p90", "mean")),
                f"{p['sim_mean'] - p['real_mean']:+.2f}",
            ]
            for p in simulated
        ]
        into, engine, back = (hops_text(hop_numbers(source, hops)) for _, hops in source.sides)
        lines += [
            "",
            f"Real against simulated, part by part ({simulated[0]['requests']} requests, ms, "
            "real / simulated): the simulation splits each first token into its way in to the "
            f"engine queueing it (the real {into}), the engine's own part ({engine}), and its "
            f"way back ({back}); {source.held_back}.",
            "",
            markdown_table(["part", "p50", "p90", "mean", "mean: sim − real"], rows),
        ]
        lines += send_state.markdown(record.get("by_send_state") or [], PARTS)
    if plot:
        lines += ["", f"![where the first token's time goes ({source.label})]({plot})"]
    return "\n".join(lines) + "\n"


def plot_ttft_parts(record: Mapping[str, Any], path: Path, title: str) -> Path:
    """Every request's hops stacked, the requests in order of their client TTFT; the title
    says whose stamps split them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpu_simulate_test.io.artifacts import atomic_open

    source = SOURCES[record["source"]]
    hops: pd.DataFrame = record["per_request"].sort_values("total")
    names = [name for name, _, _ in source.hops]
    fig, ax = plt.subplots(figsize=(10, 4.6))
    x = np.arange(len(hops))
    ax.stackplot(x, *(hops[n].clip(lower=0).to_numpy() for n in names), labels=names, alpha=0.85)
    ax.plot(x, hops["total"].to_numpy(), color="black", lw=1, label="client TTFT")
    ax.set_xlabel("requests, in order of their client TTFT")
    ax.set_ylabel("time (ms)")
    ax.set_title(f"{title}\n({source.label})")
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_open(path, "wb", encoding=None) as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)
    return path
