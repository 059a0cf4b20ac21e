"""Each request's own front end: its client TTFT less its engine TTFT, real, simulated and the
truth's repeat, as a distribution (issue 64's front-end target).

The two-clocks table's *front end* is the client's TTFT percentile less the engine's
(:func:`.clocks.clock_rows`: ``front_end_s``): two different requests at p90 and p99, so on a
40-request run its p99 moves with whichever request is slowest on either clock (the truth's own
repeat moved it by −56..+199% on the main jobs of 2026-12-05). Here each request's front end is
taken first (the way in to the engine queueing it, the wait for the step running at the send,
and the first token's way back, together) and the percentiles are read over those, on each
side: what a front end of the simulation has to match. :func:`pooled` reads the same over the
requests of several runs (a benchmark's batch), where a tail quantile rests on more than one
request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.clocks import repeat_values, sim_engine_metric

STATS: tuple[str, ...] = ("p50", "p90", "p99", "mean")
SIDES: tuple[str, ...] = ("real", "sim", "repeat")


def real_front_end_s(requests: pd.DataFrame) -> pd.Series:
    """A real run's per-request front end (client − engine TTFT, seconds) by request id, its ok
    requests with both clocks; empty without the engine's."""
    if "engine_ttft_s" not in requests.columns:
        return pd.Series(dtype=float)
    ok = requests[requests["status"] == "ok"]
    value = pd.to_numeric(ok["ttft_s"], errors="coerce") - pd.to_numeric(
        ok["engine_ttft_s"], errors="coerce"
    )
    out = pd.Series(value.to_numpy(dtype=float), index=ok["request_id"].to_numpy())
    return out[np.isfinite(out.to_numpy())]


def sim_front_end_s(sim: pd.DataFrame) -> pd.Series:
    """A simulation's per-request front end (the delay it added before the first token,
    ``frontend_delay_s``: the way in, the wait for a step and the way back; seconds) by request
    id; empty where the simulation added none."""
    if "frontend_delay_s" not in sim.columns:
        return pd.Series(dtype=float)
    ok = sim[sim["status"] == "ok"]
    value = pd.to_numeric(ok["frontend_delay_s"], errors="coerce").to_numpy(dtype=float)
    out = pd.Series(value, index=ok["request_id"].to_numpy())
    return out[np.isfinite(out.to_numpy())]


def stats_ms(values_s: Sequence[float] | np.ndarray) -> dict[str, float]:
    """:data:`STATS` of ``values_s`` in ms (numpy's linear interpolation, as vLLM's)."""
    d = m.distribution(np.asarray(values_s, dtype=float))
    return {s: 1e3 * float(getattr(d, s)) for s in STATS}


def summary(values: Mapping[str, np.ndarray]) -> dict[str, Any] | None:
    """Per side of :data:`SIDES` present in ``values`` (seconds per request, the same
    requests), its :data:`STATS` in ms, and the simulation's and the repeat's error against the
    real run per stat (``sim_vs_real``, ``repeat_vs_real``); None without a real and a
    simulated side."""
    if len(values.get("real", ())) == 0 or len(values.get("sim", ())) == 0:
        return None
    out: dict[str, Any] = {"requests": len(values["real"])}
    for side in SIDES:
        if side in values and len(values[side]):
            out[f"{side}_ms"] = stats_ms(values[side])
    for side in ("sim", "repeat"):
        if f"{side}_ms" in out:
            out[f"{side}_vs_real"] = {
                s: m.relative_error(out[f"{side}_ms"][s], out["real_ms"][s]) for s in STATS
            }
    return out


def front_end_requests(
    real: pd.DataFrame,
    joined: m.JoinedRequests,
    sim: pd.DataFrame | None,
    repeat: pd.DataFrame | None = None,
) -> dict[str, Any] | None:
    """``comparison.json`` ``front_end_requests``: over the compared requests with the engine's
    clock on the real side, each request's front end's :data:`STATS` real, simulated and (with
    ``repeat``) on the truth's repeat, and their errors against the real run (:func:`summary`);
    None without an engine clock or a simulated front end."""
    if sim is None or "frontend_delay_s" not in sim.columns or "engine_ttft_s" not in real.columns:
        return None
    frame = real.set_index("request_id").reindex(joined.request_id)
    engine = pd.to_numeric(frame["engine_ttft_s"], errors="coerce").to_numpy(dtype=float)
    client = np.asarray(joined.real.metric("ttft"), dtype=float)
    sim_front = np.asarray(joined.sim.metric("ttft"), dtype=float) - sim_engine_metric(
        sim, joined, "ttft"
    )
    keep = np.isfinite(engine) & np.isfinite(client) & np.isfinite(sim_front)
    values = {"real": (client - engine)[keep], "sim": sim_front[keep]}
    if repeat is not None:
        again = repeat.set_index("request_id").reindex(joined.request_id)
        front = repeat_values(again, "ttft_s") - repeat_values(again, "engine_ttft_s")
        values["repeat"] = front[keep & np.isfinite(front)]
    return summary(values)


def pooled(runs: Sequence[Mapping[str, pd.Series]]) -> dict[str, Any] | None:
    """:func:`summary` over every run's requests together: ``runs`` each a side's per-request
    front end (:func:`real_front_end_s`, :func:`sim_front_end_s`; ``real``, ``sim`` and
    optionally ``repeat``), each run's sides over the requests its real and simulated side
    share. ``runs`` an empty sequence: None."""
    sides: dict[str, list[np.ndarray]] = {side: [] for side in SIDES}
    for run in runs:
        both = run["real"].index.intersection(run["sim"].index)
        for side in SIDES:
            if side in run:
                mine = run[side]
                sides[side].append(mine.reindex(both).dropna().to_numpy(dtype=float))
    return summary({side: np.concatenate(v) for side, v in sides.items() if v})


def markdown(record: Mapping[str, Any] | None) -> str:
    """One paragraph for ``summary.md`` (empty without a record)."""
    if not record:
        return ""

    def side(name: str, stat: str) -> str:
        return f"{record[f'{name}_ms'][stat]:.1f}"

    said = ", ".join(
        f"{s} {side('real', s)} real / {side('sim', s)} simulated "
        f"({record['sim_vs_real'][s]:+.1%}"
        + (
            f"; the truth's repeat {side('repeat', s)}, {record['repeat_vs_real'][s]:+.1%}"
            if "repeat_ms" in record
            else ""
        )
        + ")"
        for s in STATS[:3]
    )
    return (
        "\n*Each request's own front end* (its client less its engine TTFT, then the "
        f"percentiles over the {record['requests']} requests; the table's front end is the two "
        f"percentiles' difference, two different requests at p90 and p99): {said} ms.\n"
    )
