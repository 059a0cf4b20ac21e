"""Multi-turn sessions of a workload (``workload.session``, or a trace's session columns).

Sessions arrive as requests otherwise do (the workload's arrival process, ``workload.qps``
sessions/s); each is a conversation of turns, one request per turn, in a closed loop: turn k >= 1
is sent ``think_time_s`` after turn k-1's last token arrived (the sender or the simulator waits,
so a turn >= 1 has no scheduled arrival: NaN in memory, an empty cell in the files). Its prompt is
the whole conversation so far::

    num_prefill_tokens[k] = num_prefill_tokens[k-1] + num_decode_tokens[k-1] + user_tokens[k]

(exact when every output runs to its ``num_decode_tokens``, as the real bench forces with
``ignore_eos``); turn 0's is the session's shared prefix, if any, + its user message.

Rows are session by session, each session's turns in order. Every draw here comes from a seed
stream of its own (``SeedSequence([seed, SESSION_STREAM])``), so no other workload's bytes change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_simulate_test.config.schema import LengthDistConfig, SessionConfig
from gpu_simulate_test.core.metrics import percentiles as pct
from gpu_simulate_test.core.traffic.sampling import sample_durations, sample_lengths
from gpu_simulate_test.io.artifacts import ArtifactError

SESSION_STREAM = 3
"""The seed stream of the sessions: ``SeedSequence([workload.seed, SESSION_STREAM])`` (1 is the
prompt tokens', 2 the shared prefixes')."""
SESSION_KEYS: tuple[str, ...] = ("session_id", "turn", "think_time_s", "user_tokens")
"""The per-request session columns of ``trace_lengths.csv`` and keys of ``prompts.jsonl``."""


@dataclass(frozen=True)
class Sessions:
    """Per request (row), its session, turn, think time and new user message."""

    session_id: np.ndarray
    """0-based session of each request (int64), non-decreasing: a session's rows are together."""
    turn: np.ndarray
    """0-based turn within its session (int64)."""
    think_time_s: np.ndarray
    """Seconds after the previous turn's last token before this turn is sent (0 at turn 0)."""
    user_tokens: np.ndarray
    """Tokens of the turn's new user message (int64)."""

    @property
    def num_sessions(self) -> int:
        return int(np.count_nonzero(self.turn == 0))

    @property
    def first_rows(self) -> np.ndarray:
        """The row of each session's turn 0, in session order."""
        return np.flatnonzero(self.turn == 0)

    def turns_per_session(self) -> np.ndarray:
        return np.diff(np.append(self.first_rows, len(self.turn)))

    def per_request(self, per_session: np.ndarray) -> np.ndarray:
        """A per-session value (a session's arrival) on its turn 0's row; NaN on turns >= 1."""
        out = np.full(len(self.turn), np.nan)
        out[self.first_rows] = per_session
        return out

    def columns(self) -> dict[str, np.ndarray]:
        """The session columns of ``trace_lengths.csv``, by name (:data:`SESSION_KEYS`)."""
        return {key: getattr(self, key) for key in SESSION_KEYS}


def draw_sessions(
    cfg: SessionConfig, output_len: LengthDistConfig, seed: int, num_sessions: int
) -> tuple[Sessions, np.ndarray]:
    """Draw ``num_sessions`` sessions: turns per session, then per turn its user message, its
    output length (``output_len``) and its think time; returns the sessions and the outputs."""
    turns_seq, user_seq, output_seq, think_seq = np.random.SeedSequence(
        [seed, SESSION_STREAM]
    ).spawn(4)
    turns = sample_lengths(cfg.turns, num_sessions, np.random.default_rng(turns_seq))
    total = int(turns.sum())
    session_id = np.repeat(np.arange(num_sessions, dtype=np.int64), turns)
    starts = np.cumsum(turns) - turns
    turn = np.arange(total, dtype=np.int64) - np.repeat(starts, turns)
    user = sample_lengths(cfg.user_tokens, total, np.random.default_rng(user_seq))
    decode = sample_lengths(output_len, total, np.random.default_rng(output_seq))
    think = sample_durations(cfg.think_time, total, np.random.default_rng(think_seq))
    think[turn == 0] = 0.0
    return Sessions(session_id, turn, think, user), decode


def conversation_prompts(
    sessions: Sessions, decode: np.ndarray, first_prefix_len: np.ndarray
) -> np.ndarray:
    """Each turn's prompt length: turn 0's is ``first_prefix_len`` (per request; only turn 0's
    entry is read) + its user message, a later turn's the previous prompt + the previous output
    + its user message."""
    step = sessions.user_tokens + np.where(sessions.turn > 0, np.roll(decode, 1), 0)
    step = step + np.where(sessions.turn == 0, first_prefix_len, 0)
    total = np.cumsum(step)
    before = (total - step)[sessions.first_rows]  # the running sum before each session
    return (total - np.repeat(before, sessions.turns_per_session())).astype(np.int64)


def _fail(where: str, row: int, column: str, message: str) -> ArtifactError:
    return ArtifactError(f"{where}: row {row + 1}, column {column!r}: {message}")


def check_sessions(
    where: str,
    sessions: Sessions,
    num_prefill_tokens: np.ndarray,
    num_decode_tokens: np.ndarray,
    max_context: int | None,
) -> None:
    """The session invariants; an error names ``where`` (the file), the row (1-based, header
    excluded) and the column: a session's rows contiguous with turns 0..n-1 in order, no think
    time at turn 0, turn 0's user message within its prompt, a later turn's prompt the previous
    prompt + output + its user message, and every turn within ``max_context`` (None: unchecked)."""
    sid, turn = sessions.session_id, sessions.turn
    n = len(turn)
    new = np.r_[True, sid[1:] != sid[:-1]] if n else np.zeros(0, dtype=bool)
    block_start = np.maximum.accumulate(np.where(new, np.arange(n), 0))
    expected = np.arange(n) - block_start
    bad = np.flatnonzero(turn != expected)
    if bad.size:
        row = int(bad[0])
        raise _fail(
            where,
            row,
            "turn",
            f"session {sid[row]} has turn {turn[row]} where turn {expected[row]} belongs (a "
            "session's turns are 0..n-1, on contiguous rows, in order)",
        )
    seen: dict[int, int] = {}
    for row in np.flatnonzero(new).tolist():
        if int(sid[row]) in seen:
            raise _fail(
                where,
                row,
                "session_id",
                f"session {sid[row]} starts again, after other sessions (its turn 0 is row "
                f"{seen[int(sid[row])] + 1}; a session's rows are contiguous)",
            )
        seen[int(sid[row])] = row
    first = turn == 0
    bad = np.flatnonzero(first & (sessions.think_time_s != 0))
    if bad.size:
        row = int(bad[0])
        raise _fail(
            where,
            row,
            "think_time_s",
            f"turn 0 of session {sid[row]} has think time {sessions.think_time_s[row]:g}; a "
            "session's first turn arrives at its arrival time (think_time_s 0)",
        )
    bad = np.flatnonzero(first & (sessions.user_tokens > num_prefill_tokens))
    if bad.size:
        row = int(bad[0])
        raise _fail(
            where,
            row,
            "user_tokens",
            f"turn 0 of session {sid[row]} has {sessions.user_tokens[row]} user tokens, more than "
            f"its num_prefill_tokens {num_prefill_tokens[row]}",
        )
    _check_growth(where, sessions, num_prefill_tokens, num_decode_tokens)
    if max_context is None:
        return
    bad = np.flatnonzero(num_prefill_tokens + num_decode_tokens > max_context)
    if bad.size:
        row = int(bad[0])
        raise _fail(
            where,
            row,
            "num_prefill_tokens",
            f"session {sid[row]} turn {turn[row]}: num_prefill_tokens + num_decode_tokens = "
            f"{num_prefill_tokens[row] + num_decode_tokens[row]} exceeds the model's max context "
            f"{max_context} ({bad.size} such row(s)); a session cannot be clipped (its later "
            "turns hold the whole conversation): end it at an earlier turn",
        )


def _check_growth(where: str, sessions: Sessions, prefill: np.ndarray, decode: np.ndarray) -> None:
    """A later turn's prompt is the previous prompt + the previous output + its user message."""
    expected = np.roll(prefill, 1) + np.roll(decode, 1) + sessions.user_tokens
    bad = np.flatnonzero((sessions.turn > 0) & (prefill != expected))
    if bad.size:
        row = int(bad[0])
        raise _fail(
            where,
            row,
            "num_prefill_tokens",
            f"session {sessions.session_id[row]} turn {sessions.turn[row]} has "
            f"{prefill[row]} prompt tokens, not the previous turn's {prefill[row - 1]} prompt + "
            f"{decode[row - 1]} output + its {sessions.user_tokens[row]} user tokens = "
            f"{expected[row]} (a later turn's prompt is the conversation so far)",
        )


def check_session_arrivals(where: str, column: str, arrivals: np.ndarray, turn: np.ndarray) -> None:
    """A session's turn 0 has an arrival time, its later turns none (closed loop)."""
    missing = np.flatnonzero((turn == 0) & np.isnan(arrivals))
    if missing.size:
        row = int(missing[0])
        raise _fail(where, row, column, "empty: a session's turn 0 needs an arrival time")
    extra = np.flatnonzero((turn > 0) & ~np.isnan(arrivals))
    if extra.size:
        row = int(extra[0])
        raise _fail(
            where,
            row,
            column,
            f"turn {turn[row]} has an arrival time ({arrivals[row]:g}); a later turn is sent "
            "think_time_s after the previous turn's last token (closed loop): leave it empty",
        )


def sessions_from_frame(frame: Any, where: str) -> Sessions | None:
    """The sessions of a validated ``trace_lengths`` or trace frame; None without the columns
    (all four or none: a frame with some of them is an error naming the rest)."""
    present = [k for k in SESSION_KEYS if k in frame.columns]
    if not present:
        return None
    missing = [k for k in SESSION_KEYS if k not in frame.columns]
    if missing:
        raise ArtifactError(
            f"{where}: has session column(s) {', '.join(present)} but not {', '.join(missing)} (a "
            f"multi-turn table has all of {', '.join(SESSION_KEYS)})"
        )
    return Sessions(
        session_id=frame["session_id"].to_numpy(dtype=np.int64),
        turn=frame["turn"].to_numpy(dtype=np.int64),
        think_time_s=frame["think_time_s"].to_numpy(dtype=float),
        user_tokens=frame["user_tokens"].to_numpy(dtype=np.int64),
    )


def take_sessions(sessions: Sessions, count: int) -> tuple[Sessions, int]:
    """The first ``count`` sessions (0, or more than there are: all), their ids renumbered 0, 1,
    ... in order (a trace's own ids may be any non-negative integers), and the rows they span."""
    firsts = sessions.first_rows
    rows = len(sessions.turn) if count == 0 or count >= len(firsts) else int(firsts[count])
    turn = sessions.turn[:rows]
    taken = Sessions(
        session_id=(np.cumsum(turn == 0) - 1).astype(np.int64),
        turn=turn,
        think_time_s=sessions.think_time_s[:rows],
        user_tokens=sessions.user_tokens[:rows],
    )
    return taken, rows


def describe(sessions: Sessions) -> dict[str, Any]:
    """The ``session`` entry of ``workload_meta.json``: what was drawn or imported (a generated
    workload's settings are in ``generator.session``)."""
    later = sessions.turn > 0
    stats = ("min", "mean", *pct.names((50, 90)), "max")
    return {
        "num_sessions": sessions.num_sessions,
        "arrivals": "each session's turn 0 at its arrival time; turn k >= 1 think_time_s after "
        "turn k-1's last token (closed loop)",
        "turns_per_session": pct.describe(sessions.turns_per_session()).stats(stats),
        "user_tokens": pct.describe(sessions.user_tokens).stats(stats),
        "think_time_s": pct.describe(sessions.think_time_s[later]).stats(stats),
        "total_think_time_s": float(sessions.think_time_s.sum()),
    }
