"""What a capacity search's rate means for a multi-turn workload, pure.

With sessions (:mod:`gpu_simulate_test.core.traffic.sessions`) the rate the search scales is the
workload's ``qps``: **sessions per second**, each session's turn 0; its later turns follow in a
closed loop (a think time after the previous turn's last token), so the requests a rate sends are
the simulation's to find. Beside that rate the report gives what it means in requests and users:

- the **request rate**: requests finished per second of the run, from the first send to the last
  token (a short workload's last sessions, still thinking after the others ended, pull it below
  the steady ``sessions/s × turns per session``);
- the **concurrent users**: the mean number of sessions open at once, by Little's law:
  sessions/s × the mean session's duration (its turn 0's send to its last turn's last token).

Both hold in a steady state: where the sessions all arrive within a few sessions' durations, the
run is mostly ramp-up and drain, its request rate low and Little's law high; the report says so
(:data:`STEADY_SESSIONS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.capacity.contract import RATE_UNITS
from gpu_simulate_test.core.traffic.sessions import Sessions

REQUEST_UNIT, SESSION_UNIT = RATE_UNITS
STEADY_SESSIONS = 10.0
"""The sessions' arrivals must span this many mean sessions for the request rate and the
concurrent users to be steady figures (the ramp-up and drain then bias the rate by under 10%)."""


def rate_unit(sessions: Sessions | None) -> str:
    """The unit of the rate a search over this workload scales: sessions/s with sessions."""
    return REQUEST_UNIT if sessions is None else SESSION_UNIT


@dataclass(frozen=True)
class SessionLoad:
    """One rate of a multi-turn search in requests and users (None: no session finished)."""

    qps: float
    """Sessions per second (the rate searched)."""
    request_rate_per_s: float | None
    """Requests finished per second, from the first send to the last token."""
    mean_session_s: float | None
    """Mean of each session's turn 0 send to its last turn's last token (s)."""
    concurrent_users: float | None
    """``qps`` × ``mean_session_s`` (Little's law): sessions open at once, on average."""
    arrivals_s: float | None = None
    """From the first session's turn 0 to the last one's: how long the rate was offered."""

    @property
    def steady(self) -> bool | None:
        """Whether the arrivals span :data:`STEADY_SESSIONS` mean sessions (None: unknown)."""
        if self.arrivals_s is None or self.mean_session_s is None:
            return None
        return self.arrivals_s >= STEADY_SESSIONS * self.mean_session_s

    def record(self) -> dict[str, float | bool | None]:
        return {
            "request_rate_per_s": _round(self.request_rate_per_s),
            "mean_session_s": _round(self.mean_session_s),
            "concurrent_users": _round(self.concurrent_users),
            "arrivals_s": _round(self.arrivals_s),
            "steady": self.steady,
        }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def session_load(
    qps: float, table: pd.DataFrame, request_id: np.ndarray, sessions: Sessions
) -> SessionLoad:
    """``qps`` (sessions/s) in requests and users, from one run's request table
    (``request_id``, ``arrival_time_s``: each request's send, ``e2e_s``; any order, any subset
    of the workload's requests) and the workload's sessions (``request_id``: the workload's
    request of each row of ``sessions``). A session counts once its turn 0 and every turn it
    sent finished."""
    of = pd.DataFrame(
        {
            "request_id": np.asarray(request_id),
            "session": sessions.session_id,
            "turn": sessions.turn,
        }
    )
    rows = table[["request_id", "arrival_time_s", "e2e_s"]].merge(of, on="request_id")
    sent = rows["arrival_time_s"].to_numpy(dtype=float)
    firsts = sent[rows["turn"].to_numpy() == 0]
    arrivals_s = float(firsts.max() - firsts.min()) if len(firsts) else None
    end = sent + rows["e2e_s"].to_numpy(dtype=float)
    done = np.isfinite(end)
    if not done.any():
        return SessionLoad(qps, None, None, None, arrivals_s)
    span = float(end[done].max() - np.nanmin(sent))
    request_rate = float(done.sum()) / span if span > 0 else None
    rows = rows.assign(end=end, done=done)
    per = rows.groupby("session").agg(
        start=("arrival_time_s", "min"), end=("end", "max"), done=("done", "all"),
        first=("turn", "min"),
    )  # fmt: skip
    per = per[per["done"] & (per["first"] == 0)]
    if per.empty:
        return SessionLoad(qps, request_rate, None, None, arrivals_s)
    mean_s = float((per["end"] - per["start"]).mean())
    return SessionLoad(qps, request_rate, mean_s, qps * mean_s, arrivals_s)


@dataclass(frozen=True)
class SessionCurve:
    """A multi-turn search's rates in requests and users (the main search's; the band's are
    not kept)."""

    num_sessions: int
    loads: Mapping[float, SessionLoad] = field(default_factory=dict)

    def at(self, qps: float | None) -> SessionLoad | None:
        return None if qps is None else self.loads.get(qps)

    def record(self, answer_qps: float | None) -> dict[str, Any]:
        """``capacity.json`` ``sessions``: the workload's sessions and the answer in requests and
        users (None: no answer)."""
        load = self.at(answer_qps)
        return {
            "num_sessions": self.num_sessions,
            "at_answer": None if load is None else load.record(),
        }

    def columns(self, frame: pd.DataFrame) -> pd.DataFrame:
        """``frame`` (the ``capacity`` table) with its optional per-rate columns
        ``request_rate_per_s``, ``mean_session_s`` and ``concurrent_users``."""
        out = frame.copy()
        for key in ("request_rate_per_s", "mean_session_s", "concurrent_users"):
            out[key] = [
                np.nan if (load := self.at(q)) is None or (v := getattr(load, key)) is None else v
                for q in frame["qps"]
            ]
        return out


def _num(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def answer_in_load(qps: float, load: Mapping[str, Any] | None) -> str:
    """The report's words for the answer (``qps`` sessions/s) in requests and users (empty
    without a load)."""
    if not load or load.get("request_rate_per_s") is None:
        return ""
    words = f"≈ {_num(load['request_rate_per_s'])} req/s finished"
    if load.get("concurrent_users") is not None:
        words += (
            f"; {_num(load['concurrent_users'])} concurrent users: {qps:g} {SESSION_UNIT} × "
            f"{_num(load['mean_session_s'])} s, the mean session"
        )
    return words


def unsteady_lines(load: Mapping[str, Any] | None) -> list[str]:
    """The report's caution where the answer's request rate and users are no steady figures."""
    if not load or load.get("steady") is not False:
        return []
    return [
        "",
        f"Not a steady state: the sessions arrive within {_num(load['arrivals_s'])} s, under "
        f"{STEADY_SESSIONS:g} mean sessions, so the run is mostly ramp-up and drain: its request "
        "rate is low and Little's law high. More sessions (`workload.num_requests`) make both "
        "steady.",
    ]
