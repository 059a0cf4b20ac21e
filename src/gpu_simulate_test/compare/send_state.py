"""Each first token by the engine's state when its request was sent: busy, or idle and for how
long.

A request sent to a busy engine waits for the step in progress and joins running decodes; one
sent to an idle engine wakes it, and its way in and its first step take the longer the longer
the engine slept (the main job's truths: a prompt's step 6.5 ms after under 20 ms idle, 11.3 ms
after more than 400 ms; the way in 2.2–2.4 ms after under 50 ms, 3.3–3.5 ms after more than
200 ms). A simulation can be right on the whole and wrong in each state, so compare splits each
part of the first token (:data:`~.ttft_parts.PARTS`) by the state at the send, on each side's own
timeline: the real run's engine stamps, the simulation's own queueing and finishing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.core.reporting import markdown_table

IDLE_BANDS_MS: tuple[float, ...] = (50.0, 200.0)
"""Where the idle states part (ms since the engine's last request finished)."""
STATES: tuple[str, ...] = ("idle under 50 ms", "idle 50–200 ms", "idle 200 ms or more", "busy")
"""The states, in the table's order."""
REAL_COLUMNS: tuple[str, ...] = (
    "arrival_time_s",
    "engine_arrival_time_s",
    "engine_last_token_time_s",
)
SIM_COLUMNS: tuple[str, ...] = (
    "arrival_time_s",
    "e2e_s",
    "frontend_input_s",
    "held_back_s",
    "frontend_last_token_s",
)


def states(sent_s: np.ndarray, queued_s: np.ndarray, done_s: np.ndarray) -> np.ndarray:
    """Per request, its :data:`STATES` entry: busy where another request was queued by the
    engine before its send and had not finished (``done_s``: the engine's last token), else
    idle by the time since the last one finished (the first request: the longest band)."""
    sent = np.asarray(sent_s, dtype=float)
    queued = np.asarray(queued_s, dtype=float)
    done = np.asarray(done_s, dtype=float)
    started = np.searchsorted(np.sort(queued), sent, side="left")
    ended = np.searchsorted(np.sort(done), sent, side="right")
    finished = np.sort(done)
    last = np.where(ended > 0, finished[np.maximum(ended - 1, 0)], -np.inf)
    idle_ms = (sent - last) * 1e3
    band = np.searchsorted(np.asarray(IDLE_BANDS_MS), idle_ms, side="right")
    return np.where(started > ended, STATES[-1], np.asarray(STATES[:-1])[band])


def real_states(requests: pd.DataFrame) -> pd.Series | None:
    """A real run's :func:`states` by request id, from its engine stamps (ok requests); None
    without them."""
    if not set(REAL_COLUMNS) <= set(requests.columns):
        return None
    ok = requests[requests["status"] == "ok"]
    values = ok[list(REAL_COLUMNS)].apply(pd.to_numeric, errors="coerce")
    whole = values.notna().all(axis=1)
    if not whole.any():
        return None
    v = values[whole]
    found = states(*(v[c].to_numpy() for c in REAL_COLUMNS))
    return pd.Series(found, index=ok.loc[whole, "request_id"].to_numpy())


def sim_states(sim: pd.DataFrame) -> pd.Series | None:
    """A simulation's :func:`states` by request id, on its own timeline: queued at its send plus
    its way in and the wait for the step in progress, finished at its E2E less the last token's
    way back; None without the split."""
    if not set(SIM_COLUMNS) <= set(sim.columns):
        return None
    ok = sim[sim["status"] == "ok"]
    v = ok[list(SIM_COLUMNS)].apply(pd.to_numeric, errors="coerce")
    whole = v.notna().all(axis=1)
    if not whole.any():
        return None
    v = v[whole]
    sent = v["arrival_time_s"].to_numpy()
    queued = sent + v["frontend_input_s"].to_numpy() + v["held_back_s"].to_numpy()
    done = sent + v["e2e_s"].to_numpy() - v["frontend_last_token_s"].to_numpy()
    return pd.Series(states(sent, queued, done), index=ok.loc[whole, "request_id"].to_numpy())


def by_state(
    real: pd.DataFrame,
    real_state: pd.Series,
    sim: pd.DataFrame,
    sim_state: pd.Series,
    parts: Sequence[str],
) -> list[dict[str, Any]]:
    """Per state with requests on either side: how many, and each of ``parts``' mean (ms) on
    each side. ``real``/``sim``: per request ``request_id`` and the parts in ms."""
    real = real.assign(state=real_state.reindex(real["request_id"].to_numpy()).to_numpy())
    sim = sim.assign(state=sim_state.reindex(sim["request_id"].to_numpy()).to_numpy())
    out = []
    for state in STATES:
        mine_real, mine_sim = real[real["state"] == state], sim[sim["state"] == state]
        if mine_real.empty and mine_sim.empty:
            continue
        row: dict[str, Any] = {
            "state": state,
            "real_requests": len(mine_real),
            "sim_requests": len(mine_sim),
        }
        for part in parts:
            row[part] = {
                "real_mean": float(mine_real[part].mean()) if len(mine_real) else None,
                "sim_mean": float(mine_sim[part].mean()) if len(mine_sim) else None,
            }
        out.append(row)
    return out


def markdown(rows: Sequence[Mapping[str, Any]], parts: Sequence[str]) -> list[str]:
    """The table of :func:`by_state` for ``summary.md`` (lines; none without rows)."""
    if not rows:
        return []

    def cell(v: Mapping[str, float | None]) -> str:
        real, sim = v["real_mean"], v["sim_mean"]
        return " / ".join("–" if x is None else f"{x:.2f}" for x in (real, sim))

    table = [
        [
            str(r["state"]),
            f"{r['real_requests']} / {r['sim_requests']}",
            *(cell(r[p]) for p in parts),
        ]
        for r in rows
    ]
    return [
        "",
        "By the engine's state when the request was sent (each side on its own timeline: idle "
        "since its last request finished, or busy), the parts' means (ms, real / simulated):",
        "",
        markdown_table(["state at the send", "requests", *parts], table),
    ]
