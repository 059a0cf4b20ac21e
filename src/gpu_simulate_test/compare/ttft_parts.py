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
on this process's: a hop below zero says how far they disagree (counted, never hidden).

The simulation splits its first tokens three ways (its request table's ``frontend_input_s``,
``held_back_s``, ``frontend_first_token_s``), which the real hops add up to
(:data:`SIDES`): the send to the engine queueing the request (hops 1 and 2: the input's way in
and the wait for the step that was running), the engine's own part (hop 3), and the first
token's way back (hops 4 and 5). Beside each other they say which part of the client's TTFT the
simulation gets wrong.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import send_state
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
SIDES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("send → engine queued", ("client → API server", "API server → engine")),
    ("engine (queue + first token)", ("engine (queue + first token)",)),
    ("first token → client", ("engine → API server", "API server → client")),
)
"""The parts the simulation splits its first tokens into, each with the real hops it adds up."""
SIM_COLUMNS: tuple[str, ...] = ("frontend_input_s", "held_back_s", "frontend_first_token_s")
"""The simulated request table's split of its front end (:mod:`..vidur_simulate.metrics`)."""


def sim_parts(sim: pd.DataFrame) -> pd.DataFrame:
    """Per simulated ok request with the split: each of :data:`SIDES` in ms (the engine's part
    is the TTFT less the others); empty without the split (an older run, no front end)."""
    if not set(SIM_COLUMNS) <= set(sim.columns):
        return pd.DataFrame()
    ok = sim[sim["status"] == "ok"]
    cols = ok[[*SIM_COLUMNS, "ttft_s"]].apply(pd.to_numeric, errors="coerce")
    whole = cols.notna().all(axis=1)
    cols = cols[whole]
    into = cols["frontend_input_s"] + cols["held_back_s"]
    back = cols["frontend_first_token_s"]
    return pd.DataFrame(
        {
            "request_id": ok.loc[whole, "request_id"].to_numpy(),
            SIDES[0][0]: 1e3 * into.to_numpy(),
            SIDES[1][0]: 1e3 * (cols["ttft_s"] - into - back).to_numpy(),
            SIDES[2][0]: 1e3 * back.to_numpy(),
        }
    )


def side_by_side(hops: pd.DataFrame, sim: pd.DataFrame | None) -> list[dict[str, Any]]:
    """Each of :data:`SIDES`, real (its hops added) against simulated, over the requests both
    have: p50, p90 and mean in ms each; empty without the simulated split."""
    parts = pd.DataFrame() if sim is None else sim_parts(sim)
    if parts.empty:
        return []
    both = hops.merge(parts, on="request_id", how="inner", suffixes=("", " (sim)"))
    if both.empty:
        return []
    out = []
    for name, real_hops in SIDES:
        real = both[list(real_hops)].sum(axis=1).to_numpy(dtype=float)
        simulated = both[f"{name} (sim)" if name in hops.columns else name].to_numpy(dtype=float)
        out.append(
            {
                "part": name,
                "requests": len(both),
                **{
                    f"{side}_{s}": float(np.percentile(v, int(s[1:])) if s != "mean" else v.mean())
                    for side, v in (("real", real), ("sim", simulated))
                    for s in ("p50", "p90", "mean")
                },
            }
        )
    return out


def by_send_state(
    hops: pd.DataFrame, requests: pd.DataFrame, sim: pd.DataFrame | None
) -> list[dict[str, Any]]:
    """Each of :data:`SIDES` real against simulated per engine state at the send
    (:mod:`.send_state`); empty without the simulated split or the real engine's stamps."""
    parts = pd.DataFrame() if sim is None else sim_parts(sim)
    real_state = send_state.real_states(requests)
    sim_state = None if sim is None else send_state.sim_states(sim)
    if parts.empty or real_state is None or sim_state is None:
        return []
    real = pd.DataFrame(
        {"request_id": hops["request_id"].to_numpy()}
        | {name: hops[list(real_hops)].sum(axis=1).to_numpy() for name, real_hops in SIDES}
    )
    return send_state.by_state(real, real_state, parts, sim_state, [n for n, _ in SIDES])


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
    sim: pd.DataFrame | None = None,
) -> dict[str, Any] | None:
    """``comparison.json`` ``ttft_parts``: each hop's p50/p90/p99/mean (ms) and its share of
    the mean client TTFT, the hops below zero, the simulation's front end beside the real one
    (``clocks``' TTFT rows), and with ``sim`` (its request table) each part the simulation
    splits its first tokens into beside the real hops it adds up (``simulated``,
    :func:`side_by_side`); None without the API server's stamps."""
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
        "simulated": side_by_side(hops, sim),
        "by_send_state": by_send_state(hops, requests, sim),
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
        lines += [
            "",
            f"Real against simulated, part by part ({simulated[0]['requests']} requests, ms, "
            "real / simulated): the simulation splits each first token into its way in to the "
            "engine queueing it (the real hops 1 and 2, the wait for a running step included), "
            "the engine's own part (hop 3), and its way back (hops 4 and 5).",
            "",
            markdown_table(["part", "p50", "p90", "mean", "mean: sim − real"], rows),
        ]
        lines += send_state.markdown(record.get("by_send_state") or [], [n for n, _ in SIDES])
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
