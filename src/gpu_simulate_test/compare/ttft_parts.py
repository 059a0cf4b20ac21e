"""Where a real request's first token spends its time, hop by hop, at the client.

A vLLM run's stamps split each request's client TTFT (send → first token received) into five
hops that add up to it:

1. **client → API server**: the send to the API server taking the request in (HTTP, the
   server's event loop), from its span (``front_end_stamps.csv``, :mod:`..core.engines.front_end`);
2. **API server → engine**: to the engine queueing it (tokenization, input processing, the hop to
   the engine core, which takes input in only between steps: the step running when it came);
3. **engine**: queued to its first token (the engine's clock: what Vidur models);
4. **engine → API server**: the first output back to the API server (detokenizing, the output
   queue behind other requests' outputs);
5. **API server → client**: streamed to the client and read there.

The engine's stamps are on its own clock, the API server's on the wall clock and the client's
on this process's: a hop below zero says how far they disagree (counted, never hidden). The
simulation models hops 1, 2, 4 and 5 together as its front end (client − engine).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.core.reporting import markdown_table
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv
from gpu_simulate_test.io.schemas import FRONT_END_STAMPS

HOPS: tuple[tuple[str, str, str], ...] = (
    ("client → API server", "arrival_time_s", "front_arrival_time_s"),
    ("API server → engine", "front_arrival_time_s", "engine_arrival_time_s"),
    ("engine (queue + first token)", "engine_arrival_time_s", "engine_first_token_time_s"),
    ("engine → API server", "engine_first_token_time_s", "front_first_token_time_s"),
    ("API server → client", "front_first_token_time_s", "first_token_time_s"),
)
"""Each hop: its name, and the stamps it runs from and to (run clock, seconds)."""
STATS: tuple[str, ...] = ("p50", "p90", "p99", "mean")


def hop_frame(requests: pd.DataFrame, front: pd.DataFrame) -> pd.DataFrame:
    """Per ok request with every stamp: each hop in ms, and the client TTFT (``total``)."""
    joined = requests[requests["status"] == "ok"].merge(front, on="request_id", how="inner")
    columns = {stamp for _, a, b in HOPS for stamp in (a, b)}
    if not columns <= set(joined.columns):
        return pd.DataFrame()
    stamps = joined[sorted(columns)].apply(pd.to_numeric, errors="coerce")
    whole = stamps.notna().all(axis=1)
    out = pd.DataFrame({"request_id": joined.loc[whole, "request_id"].to_numpy()})
    for name, start, end in HOPS:
        out[name] = 1e3 * (stamps.loc[whole, end] - stamps.loc[whole, start]).to_numpy()
    out["total"] = out[[name for name, _, _ in HOPS]].sum(axis=1)
    return out


def read_front(run_dir: Path) -> pd.DataFrame | None:
    """A real run's ``front_end_stamps.csv``; None where it has none (another engine, an older
    run, a server without spans)."""
    path = run_dir / layout.FRONT_END_STAMPS
    return read_csv(path, FRONT_END_STAMPS) if path.is_file() else None


def ttft_parts(
    run_dir: Path,
    requests: pd.DataFrame,
    clocks: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any] | None:
    """``comparison.json`` ``ttft_parts``: each hop's p50/p90/p99/mean (ms) and its share of
    the mean client TTFT, the hops below zero, and the simulation's front end beside the real
    one (``clocks``' TTFT rows); None without the API server's stamps."""
    front = read_front(run_dir)
    if front is None:
        return None
    hops = hop_frame(requests, front)
    if hops.empty:
        return None
    mean_total = float(hops["total"].mean())
    parts = []
    for name, _, _ in HOPS:
        values = hops[name].to_numpy(dtype=float)
        parts.append(
            {
                "hop": name,
                **{s: float(np.percentile(values, int(s[1:]))) for s in STATS if s != "mean"},
                "mean": float(values.mean()),
                "share_of_mean": float(values.mean() / mean_total) if mean_total else None,
                "below_zero": int((values < 0).sum()),
            }
        )
    front_end = {
        row["stat"]: {
            "real_ms": 1e3 * float(row["front_end_s"]),
            "sim_ms": 1e3 * float(row["sim_front_end_s"]),
        }
        for row in clocks or ()
        if row["metric"] == "ttft"
    }
    return {
        "requests": len(hops),
        "hops": parts,
        "client_ttft_ms": {s: float(np.percentile(hops["total"], int(s[1:]))) for s in STATS[:3]},
        "front_end": front_end,
        "per_request": hops,
    }


def ttft_parts_markdown(record: Mapping[str, Any] | None, plot: str | None) -> str:
    """The ``## Where the first token's time goes`` section of ``summary.md``."""
    if record is None:
        return ""
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
        f"Each of {record['requests']} requests' client TTFT split into its hops by the client's, "
        "the API server's (its span) and the engine's stamps; the hops add up to the client "
        "TTFT. *Below zero*: requests where two clocks disagree by more than the hop.",
        "",
        markdown_table(["hop", *STATS, "share of the mean", "below zero"], rows),
    ]
    front = record.get("front_end") or {}
    if front:
        said = ", ".join(
            f"{stat} {v['real_ms']:.1f} real / {v['sim_ms']:.1f} simulated"
            for stat, v in front.items()
        )
        lines += [
            "",
            "The simulation's front end is hops 1, 2, 4 and 5 together (client − engine TTFT): "
            f"{said} ms.",
        ]
    if plot:
        lines += ["", f"![where the first token's time goes]({plot})"]
    return "\n".join(lines) + "\n"


def plot_ttft_parts(record: Mapping[str, Any], path: Path, title: str) -> Path:
    """Every request's hops stacked, the requests in order of their client TTFT."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from gpu_simulate_test.io.artifacts import atomic_open

    hops: pd.DataFrame = record["per_request"].sort_values("total")
    names = [name for name, _, _ in HOPS]
    fig, ax = plt.subplots(figsize=(10, 4.6))
    x = np.arange(len(hops))
    ax.stackplot(x, *(hops[n].clip(lower=0).to_numpy() for n in names), labels=names, alpha=0.85)
    ax.plot(x, hops["total"].to_numpy(), color="black", lw=1, label="client TTFT")
    ax.set_xlabel("requests, in order of their client TTFT")
    ax.set_ylabel("time (ms)")
    ax.set_title(title)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_open(path, "wb", encoding=None) as handle:
        fig.savefig(handle, format="png", dpi=110)
    plt.close(fig)
    return path
