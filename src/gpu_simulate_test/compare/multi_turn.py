"""Multi-turn sessions, real against simulated: TTFT by turn and how long a session lasts.

A multi-turn workload (``core/traffic/sessions.py``) sends turn k >= 1 of a session
``think_time_s`` after turn k-1's last token, on each side's own clock (the real sender's, the
simulation's closed loop), and each turn's prompt holds the whole conversation so far: later turns
have longer prompts and, with prefix caching, more of them cached. Neither ``request_metrics``
table says which session or turn a request is: they come from the workload run both runs name
(``run_meta.json`` ``workload_dir``).

- **TTFT by turn**: p50/p90 of each turn index, real and simulated, on each clock
  (:mod:`.groups`); turns with fewer than :data:`MIN_TURN_REQUESTS` compared requests are
  merged into the last bucket, ``≥k``.
- **Session duration**: first send of turn 0 to the last token of the session's last turn, on
  the client's clock (each side's ``arrival_time_s`` and ``e2e_s``), over the sessions whose
  every turn is compared (ok on both sides, after the warm-up).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.groups import (
    GROUP_STATS,
    ClockTtft,
    groups_markdown,
    ttft_by_group,
)
from gpu_simulate_test.core.reporting import markdown_table
from gpu_simulate_test.core.run_inputs import RunInput
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io.artifacts import ArtifactError

MIN_TURN_REQUESTS = 10
"""A turn with fewer compared requests than this (and every later turn) is one bucket, ``≥k``."""


def load_sessions(real: RunInput, sim: RunInput) -> tuple[pd.DataFrame | None, str | None]:
    """Each request's session and turn (``request_id``, ``session_id``, ``turn``, in the
    workload's order), from the workload run the simulation names, else the real run's
    (``run_meta.json`` ``workload_dir``). (None, None) where neither names one or the workload
    has no sessions; (None, why) where the one named is not there, unreadable or another."""
    named = [str(p) for p in (sim.meta.get("workload_dir"), real.meta.get("workload_dir")) if p]
    if not named:
        return None, None
    found = next((Path(p) for p in dict.fromkeys(named) if Path(p).is_dir()), None)
    if found is None:
        return None, f"the workload run `{named[0]}` (run_meta.json workload_dir) is not there"
    try:
        workload = load_workload(found)
    except ArtifactError as exc:
        return None, f"the workload run `{found}` could not be read: {exc}"
    if workload.workload_id != real.workload_id:
        return None, (
            f"the workload run `{found}` now holds workload {workload.workload_id}, not "
            f"{real.workload_id}"
        )
    if workload.sessions is None:
        return None, None
    return (
        pd.DataFrame(
            {
                "request_id": workload.lengths["request_id"].to_numpy(dtype=np.int64),
                "session_id": workload.sessions.session_id,
                "turn": workload.sessions.turn,
            }
        ),
        None,
    )


def turn_buckets(
    turn: np.ndarray, min_requests: int = MIN_TURN_REQUESTS
) -> tuple[np.ndarray, list[str]]:
    """A bucket label per request (``"0"``, ``"1"``, …, then ``"≥k"`` from the first turn k >= 1
    with fewer than ``min_requests`` requests on; ``""`` where the turn is unknown, a negative
    number) and the buckets in order."""
    turn = np.asarray(turn, dtype=np.int64)
    known = turn >= 0
    labels = np.full(turn.shape, "", dtype=object)
    if not known.any():
        return labels, []
    counts = np.bincount(turn[known])
    small = np.flatnonzero(counts[1:] < min_requests)
    merge_from = int(small[0]) + 1 if small.size else counts.size
    order = [str(k) for k in range(merge_from)]
    for k in range(merge_from):
        labels[turn == k] = order[k]
    if merge_from < counts.size:
        last = f"≥{merge_from}"
        labels[turn >= merge_from] = last
        order.append(last)
    return labels, order


def session_durations(table: pd.DataFrame, joined: m.JoinedRequests) -> dict[str, Any]:
    """Per side, the sessions' durations (first send of turn 0 to the last token of the last
    turn, seconds) over the sessions whose every turn is among ``joined``: their count and
    :data:`GROUP_STATS` real and simulated, with the error ``sim / real − 1``."""
    position = pd.Series(np.arange(len(joined)), index=joined.request_id)
    rows = table.assign(position=position.reindex(table["request_id"]).to_numpy())
    broken = rows.loc[rows["position"].isna(), "session_id"].unique()
    rows = rows[~rows["session_id"].isin(broken)]
    ends = rows.groupby("session_id", sort=False)["position"].agg(["first", "last"])
    first = ends["first"].to_numpy(dtype=np.int64)
    last = ends["last"].to_numpy(dtype=np.int64)
    out: dict[str, Any] = {"clock": "client", "sessions": len(ends)}
    sides = {}
    for name, side in (("real", joined.real), ("sim", joined.sim)):
        end = side.arrival_time_s[last] + side.e2e_s[last]
        sides[name] = m.distribution(end - side.arrival_time_s[first])
    for stat in GROUP_STATS:
        r, s = sides["real"].stat(stat), sides["sim"].stat(stat)
        out.update(
            {f"real_{stat}_s": r, f"sim_{stat}_s": s, f"error_{stat}": m.relative_error(s, r)}
        )
    return out


def compare_multi_turn(
    table: pd.DataFrame,
    joined: m.JoinedRequests,
    clocks: Sequence[ClockTtft],
    min_requests: int = MIN_TURN_REQUESTS,
) -> dict[str, Any]:
    """``comparison.json`` ``multi_turn``: the sessions, TTFT by turn bucket per clock and the
    sessions' durations."""
    turn = table.set_index("request_id")["turn"].reindex(joined.request_id)
    labels, order = turn_buckets(turn.fillna(-1).to_numpy(dtype=np.int64), min_requests)
    return {
        "sessions": int(table["session_id"].nunique()),
        "min_requests_per_turn": min_requests,
        "turn_buckets": order,
        "ttft_by_turn": ttft_by_group(labels, order, clocks),
        "session_duration": session_durations(table, joined),
    }


def _s(value: float) -> str:
    return f"{value:.3f}" if np.isfinite(value) else "–"


def _pct(value: float) -> str:
    return f"{value:+.1%}" if np.isfinite(value) else "–"


def multi_turn_markdown(
    block: Mapping[str, Any] | None, plot: str | None, skipped: str | None
) -> str:
    """The ``## Multi-turn sessions`` section of ``summary.md``: empty for a workload without
    sessions, a line where the workload could not be read (``skipped``)."""
    if block is None:
        if not skipped:
            return ""
        return (
            f"\n*Multi-turn sessions*: not looked for: {skipped} (a workload's sessions are "
            "read from it).\n"
        )
    duration = block["session_duration"]
    body = [
        [
            label,
            str(duration["sessions"]),
            *(_s(duration[f"{side}_{stat}_s"]) for stat in GROUP_STATS),
        ]
        for label, side in (("real", "real"), ("simulated", "sim"))
    ]
    body.append(["error", "", *(_pct(duration[f"error_{stat}"]) for stat in GROUP_STATS)])
    lines = [
        "",
        "## Multi-turn sessions",
        "",
        f"{block['sessions']} sessions; a turn k ≥ 1 is sent its think time after turn k−1's last "
        "token, on each side's own clock. TTFT (ms) by turn, error = simulated / real − 1 "
        f"(turns with fewer than {block['min_requests_per_turn']} compared requests are merged "
        "into the last bucket, ≥k):",
        "",
        groups_markdown(block["ttft_by_turn"], "turn"),
        "",
    ]
    if plot:
        lines += [f"![TTFT by turn]({plot})", ""]
    lines += [
        "Session duration (s): first send of turn 0 to the last token of the last turn, client "
        "clock, over the sessions whose every turn is compared:",
        "",
        markdown_table(["", "sessions", *(f"{stat}" for stat in GROUP_STATS)], body),
        "",
    ]
    return "\n".join(lines)
