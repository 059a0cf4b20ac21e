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
from gpu_simulate_test.core.metrics import percentiles as pct

STATS: tuple[str, ...] = (*(f"p{q}" for q in pct.select(50, 90, 99)), "mean")


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
    ``frontend_delay_s``: the way in, the wait for a step and the way back; zero without a
    front-end model; seconds) by request id, its ok requests with a finite one; empty where the
    run has no such column (an older run)."""
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


def errors(side: Mapping[str, float], real: Mapping[str, float]) -> dict[str, float]:
    """Per stat, ``side`` against ``real`` (``side / real − 1``)."""
    return {s: m.relative_error(side[s], real[s]) for s in STATS}


def pooled(runs: Sequence[Mapping[str, pd.Series]]) -> dict[str, Any] | None:
    """Each request's front end over every run's requests together (ms): ``runs`` each a side's
    per-request front end by request id (:func:`real_front_end_s`, :func:`sim_front_end_s`;
    ``real``, ``sim`` and optionally ``repeat``). The real and the simulated side are read over
    the requests both have in each run, the repeat against the real side over the requests all
    three have (``repeat_requests``), so that each error compares the same requests: ``real_ms``,
    ``sim_ms``, ``sim_vs_real``, and with a repeat ``repeat_ms`` and ``repeat_vs_real``. None
    without a request on both sides."""
    real: list[np.ndarray] = []
    sim: list[np.ndarray] = []
    again: list[np.ndarray] = []
    again_real: list[np.ndarray] = []
    for run in runs:
        both = run["real"].index.intersection(run["sim"].index)
        real.append(run["real"].reindex(both).to_numpy(dtype=float))
        sim.append(run["sim"].reindex(both).to_numpy(dtype=float))
        if "repeat" in run:
            three = both.intersection(run["repeat"].index)
            again.append(run["repeat"].reindex(three).to_numpy(dtype=float))
            again_real.append(run["real"].reindex(three).to_numpy(dtype=float))
    if not real or sum(len(v) for v in real) == 0:
        return None
    out: dict[str, Any] = {"requests": int(sum(len(v) for v in real))}
    out["real_ms"], out["sim_ms"] = stats_ms(np.concatenate(real)), stats_ms(np.concatenate(sim))
    out["sim_vs_real"] = errors(out["sim_ms"], out["real_ms"])
    if again and sum(len(v) for v in again):
        out["repeat_requests"] = int(sum(len(v) for v in again))
        out["repeat_ms"] = stats_ms(np.concatenate(again))
        out["repeat_vs_real"] = errors(out["repeat_ms"], stats_ms(np.concatenate(again_real)))
    return out


def front_end_requests(
    real: pd.DataFrame,
    joined: m.JoinedRequests,
    sim: pd.DataFrame | None,
    repeat: pd.DataFrame | None = None,
) -> dict[str, Any] | None:
    """``comparison.json`` ``front_end_requests``: over the compared requests (``joined``)
    with the engine's clock on the real side and a finite simulated front end, each request's
    front end's :data:`STATS` (ms) real, simulated and (with ``repeat``) on the truth's repeat,
    with their errors against the real run over the same requests (:func:`pooled` of this one
    run); None without the engine's clock or the simulation's ``frontend_delay_s``."""
    if sim is None:
        return None
    ids = pd.Index(joined.request_id)
    run = {"real": real_front_end_s(real), "sim": sim_front_end_s(sim)}
    if repeat is not None:
        run["repeat"] = real_front_end_s(repeat)
    run = {side: values[values.index.isin(ids)] for side, values in run.items()}
    if run["real"].empty or run["sim"].empty:
        return None
    return pooled([run])


def markdown(record: Mapping[str, Any] | None) -> str:
    """One paragraph for ``summary.md`` (empty without a record)."""
    if not record:
        return ""

    def pct_text(value: float) -> str:
        return f"{value:+.1%}" if np.isfinite(value) else "n/a"

    said = ", ".join(
        f"{s} {record['real_ms'][s]:.1f} ms real / {record['sim_ms'][s]:.1f} simulated "
        f"({pct_text(record['sim_vs_real'][s])}"
        + (
            f"; the truth's repeat {record['repeat_ms'][s]:.1f}, "
            f"{pct_text(record['repeat_vs_real'][s])}"
            if "repeat_ms" in record
            else ""
        )
        + ")"
        for s in STATS[:3]
    )
    return (
        "\n*Each request's own front end* (its client less its engine TTFT, then the "
        f"percentiles over the {record['requests']} requests; the table's front end is the two "
        f"percentiles' difference, two different requests at p90 and p99): {said}.\n"
    )
