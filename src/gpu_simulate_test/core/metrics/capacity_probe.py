"""The capacity probe's rule, shared by every stage that measures a capacity (the fidelity
campaign, the capacity stage's real search, an imported burst).

An all-at-once burst of requests of the fixed length mix is replayed for real; **capacity =
completed requests / (last completion − first arrival)**, the engine's completion rate while its
queue never runs dry. A multi-turn workload's rate is sessions/s (its turns follow in a closed
loop): its probe is a burst of sessions without think time, and its capacity the burst's request
capacity over the turns per session (:func:`session_capacity`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from gpu_simulate_test.io.artifacts import ArtifactError

SESSION_UNIT = "sessions/s"
"""A multi-turn capacity's unit: ``capacity.contract.RATE_UNITS[1]`` (core imports nothing above
it; a test holds the two equal)."""


def burst_capacity(arrival_time_s: npt.ArrayLike, e2e_s: npt.ArrayLike, ok: npt.ArrayLike) -> float:
    """Requests/s the engine completes with a full queue: ok requests / (last finish − first
    arrival) of an all-at-once burst. Raises ValueError when nothing completed."""
    arrival = np.asarray(arrival_time_s, dtype=float)
    finish = arrival + np.asarray(e2e_s, dtype=float)
    finish = finish[np.asarray(ok, dtype=bool) & np.isfinite(finish)]
    if finish.size == 0:
        raise ValueError("capacity probe: no request completed")
    span = float(finish.max() - arrival.min())
    if span <= 0:
        raise ValueError(f"capacity probe: non-positive span {span} s")
    return finish.size / span


def probe_record(requests: pd.DataFrame, where: str, hint: str = "") -> dict[str, Any]:
    """A capacity probe's record from its ``request_metrics`` rows (a burst): requests sent and
    completed, :func:`burst_capacity` and the output tokens per second over the same span.
    Raises ArtifactError naming ``where`` (the run directory) and ``hint`` when nothing
    completed."""
    ok = (requests["status"] == "ok").to_numpy()
    try:
        capacity = burst_capacity(requests["arrival_time_s"], requests["e2e_s"], ok)
    except ValueError as exc:
        raise ArtifactError(f"{where}: {exc}{'; ' + hint if hint else ''}") from exc
    finish = (requests["arrival_time_s"] + requests["e2e_s"])[ok]
    span = float(finish.max() - requests["arrival_time_s"].min())
    return {
        "probe_requests": len(requests),
        "probe_ok": int(ok.sum()),
        "probe_run": where,
        "capacity_qps": round(capacity, 4),
        "output_tokens_per_s": round(float(requests.loc[ok, "num_decode_tokens"].sum()) / span, 2),
    }


def session_capacity(record: Mapping[str, Any], num_sessions: int) -> dict[str, Any]:
    """A multi-turn probe's record in sessions/s: the burst's request capacity over the turns
    per session it sent. At that session rate the turns offer the engine the request rate it
    completed with a full queue (steady state: requests/s = sessions/s × turns per session)."""
    if num_sessions <= 0:
        raise ValueError("capacity probe: a multi-turn burst without sessions")
    turns = int(record["probe_requests"]) / num_sessions
    requests_qps = float(record["capacity_qps"])
    return {
        **record,
        "probe_sessions": num_sessions,
        "turns_per_session": round(turns, 4),
        "request_capacity_qps": requests_qps,
        "capacity_qps": round(requests_qps / turns, 4),
        "rate_unit": SESSION_UNIT,
    }
