"""TTFT of groups of the compared requests, real against simulated, on each clock the comparison
has (pure: arrays in, rows out).

A group is a label per joined request: ``hit``/``miss`` of the prefix cache
(:mod:`.prefix_cache`), a session's turn (:mod:`.multi_turn`). Clocks as in :mod:`.clocks`: the
engine's own (where the real run has ``engine_ttft_s``) against the simulated engine's (without
the front-end delay the simulation added), then the client's against the simulated client's;
never mixed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.clocks import sim_engine_metric
from gpu_simulate_test.core.reporting import markdown_table

GROUP_STATS: tuple[str, ...] = ("p50", "p90")
"""The statistics of every group's TTFT (a group may hold a few requests: no p99)."""


@dataclass(frozen=True)
class ClockTtft:
    """TTFT of every joined request on one clock, real and simulated (seconds)."""

    clock: str
    """``engine`` or ``client``."""
    real_s: np.ndarray
    sim_s: np.ndarray


def ttft_clocks(
    real: pd.DataFrame, sim: pd.DataFrame | None, joined: m.JoinedRequests
) -> tuple[ClockTtft, ...]:
    """The joined requests' TTFT on each clock: the engine's first where the real run has it for
    any of them (``engine_ttft_s``), then the client's (``ttft_s``)."""
    client = ClockTtft("client", joined.real.ttft_s, joined.sim.ttft_s)
    frame = real.set_index("request_id").reindex(joined.request_id)
    if "engine_ttft_s" not in frame.columns:
        return (client,)
    engine = pd.to_numeric(frame["engine_ttft_s"], errors="coerce").to_numpy(dtype=float)
    if not np.isfinite(engine).any():
        return (client,)
    return ClockTtft("engine", engine, sim_engine_metric(sim, joined, "ttft")), client


def ttft_by_group(
    labels: np.ndarray, order: Sequence[str], clocks: Sequence[ClockTtft]
) -> list[dict[str, Any]]:
    """Per clock and group (in ``order``): the group's requests and its TTFT :data:`GROUP_STATS`
    real and simulated (seconds) with the error ``sim / real − 1``. ``labels`` holds one label
    per joined request (a request whose label is in no group is left out)."""
    rows: list[dict[str, Any]] = []
    for clock in clocks:
        for group in order:
            keep = labels == group
            real = m.distribution(clock.real_s[keep])
            sim = m.distribution(clock.sim_s[keep])
            row: dict[str, Any] = {
                "clock": clock.clock,
                "group": group,
                "requests": int(keep.sum()),
            }
            for stat in GROUP_STATS:
                r, s = real.stat(stat), sim.stat(stat)
                row[f"real_{stat}_s"] = r
                row[f"sim_{stat}_s"] = s
                row[f"error_{stat}"] = m.relative_error(s, r)
            rows.append(row)
    return rows


def _ms(value: float) -> str:
    return f"{value * 1e3:.2f}" if np.isfinite(value) else "–"


def _pct(value: float) -> str:
    return f"{value:+.1%}" if np.isfinite(value) else "–"


def groups_markdown(rows: Sequence[dict[str, Any]], group_title: str) -> str:
    """The rows of :func:`ttft_by_group` as a markdown table (ms; no trailing newline)."""
    header = ["clock", group_title, "requests"]
    for stat in GROUP_STATS:
        header += [f"{stat} real", f"{stat} sim", f"{stat} error"]
    body = []
    for row in rows:
        line = [row["clock"], str(row["group"]), str(row["requests"])]
        for stat in GROUP_STATS:
            line += [
                _ms(row[f"real_{stat}_s"]),
                _ms(row[f"sim_{stat}_s"]),
                _pct(row[f"error_{stat}"]),
            ]
        body.append(line)
    return markdown_table(header, body)
