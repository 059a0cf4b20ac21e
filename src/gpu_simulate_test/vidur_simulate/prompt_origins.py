"""What each prompt of a workload is made of, for the prefix cache (:mod:`.v1_prefix`): a shared
prefix (``trace_lengths.csv``'s ``prefix_id``/``prefix_len``), the request's own tokens and, in a
multi-turn session, the conversation so far (the earlier turns' prompts and answers), or a
Mooncake trace's hash-id blocks (``hash_ids``/``block_tokens``); and a session's closed loop
(each turn sent a think time after the previous one's last token)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.overhead import FrontEnd
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.core.traffic.mooncake import block_segments, parse_hash_ids
from gpu_simulate_test.core.traffic.sessions import Sessions
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.simulator.kv_cache import Segments
from gpu_simulate_test.simulator.types import ARRIVED
from gpu_simulate_test.simulator.types import NAME as V1_NAME
from gpu_simulate_test.vidur_simulate.metrics import VIDUR_ID


def prompt_segments(
    lengths: pd.DataFrame,
    prefill: np.ndarray,
    sessions: Sessions | None = None,
    decode: np.ndarray | None = None,
) -> list[Segments] | None:
    """Per request (row order), its prompt's segments: its shared prefix, if any, then its own
    tokens; a session's turn k >= 1: turn k-1's segments, its answer (``decode`` tokens) and the
    new message; a Mooncake trace's prompt: its blocks, each named by its hash id
    (:func:`..core.traffic.mooncake.block_segments`). None for a workload with none of them
    (every prompt its own). ``prefill``: the prompt lengths simulated (a prefix never longer than
    its prompt)."""
    if sessions is not None:
        if decode is None:
            raise ValueError("a multi-turn workload's segments need its output lengths")
        return _session_segments(lengths, prefill, decode, sessions)
    if "hash_ids" in lengths.columns:
        if "block_tokens" not in lengths.columns:
            raise ArtifactError("trace_lengths: column 'hash_ids' without 'block_tokens'")
        return [
            block_segments(parse_hash_ids(ids, f"trace_lengths row {r + 1}"), int(b), n, ("U", r))
            for r, (ids, b, n) in enumerate(
                zip(
                    lengths["hash_ids"].tolist(),
                    lengths["block_tokens"].tolist(),
                    np.asarray(prefill, dtype=np.int64).tolist(),
                    strict=True,
                )
            )
        ]
    if "prefix_id" not in lengths.columns:
        return None
    ids = lengths["prefix_id"].to_numpy()
    plen = lengths["prefix_len"].to_numpy()
    out: list[Segments] = []
    for r, total in enumerate(np.asarray(prefill, dtype=np.int64).tolist()):
        shared = 0
        parts: list[tuple[object, int]] = []
        if not pd.isna(ids[r]) and int(ids[r]) >= 0:
            shared = min(int(plen[r]), total)
            parts.append((("P", int(ids[r])), shared))
        parts.append((("U", r), total - shared))
        out.append(parts)
    return out


def prefix_cache_meta(stats: dict[str, int] | None) -> dict[str, Any] | None:
    """``run_meta.json`` ``prefix_cache``: vLLM's totals and the hit rate (hits / queries, in
    tokens, first admissions: vLLM's ``vllm:prefix_cache_hits`` / ``queries``)."""
    if stats is None:
        return None
    queries = stats["queries"]
    return {**stats, "hit_rate": stats["hits"] / queries if queries else None}


def _session_segments(
    lengths: pd.DataFrame, prefill: np.ndarray, decode: np.ndarray, sessions: Sessions
) -> list[Segments]:
    first = prompt_segments(lengths, prefill) if "prefix_id" in lengths.columns else None
    out: list[Segments] = []
    for r, turn in enumerate(sessions.turn.tolist()):
        if turn == 0:
            out.append(first[r] if first is not None else [(("U", r), int(prefill[r]))])
            continue
        user = int(sessions.user_tokens[r])
        out.append([*out[r - 1], (("O", r - 1), int(decode[r - 1])), (("U", r), user)])
    return out


def closed_loop(sessions: Sessions, extra_s: float = 0.0) -> list[tuple[int, float]]:
    """Per request, the request sent after it (its session's next turn; -1: none) and the
    seconds from its last token in the engine to that send reaching the engine: the think time
    plus ``extra_s`` (the front end's way out and back in)."""
    after = [(-1, 0.0)] * len(sessions.turn)
    for r in np.flatnonzero(sessions.turn > 0).tolist():
        after[r - 1] = (r, float(sessions.think_time_s[r]) + extra_s)
    return after


def known_arrivals(arrival_s: np.ndarray) -> np.ndarray:
    """Arrivals for Vidur's trace file, where a closed-loop turn has none yet: its session's
    last known one (rows are session by session, so the times never go back)."""
    out = pd.Series(np.asarray(arrival_s, dtype=float)).ffill().to_numpy()
    return np.where(np.isnan(out), 0.0, out)


def session_loop(
    sessions: Sessions | None, scheduler: str, frontend: FrontEnd | None, replaying: bool
) -> list[tuple[int, float]] | None:
    """A multi-turn workload's closed loop for the simulation (None without sessions, or in an
    oracle replay, which follows the real run's own arrivals); ConfigError for a scheduler
    without one."""
    if sessions is None or replaying:
        return None
    if scheduler != V1_NAME:
        raise ConfigError(
            f"a multi-turn workload ({sessions.num_sessions} sessions) needs "
            f"vidur.scheduler.name={V1_NAME}: Vidur's {scheduler} scheduler has no closed loop "
            "(each turn sent after the previous one's answer)"
        )
    return closed_loop(sessions, _idle_input_s(frontend) + _output_s(frontend))


def simulated_sends(
    raw: pd.DataFrame, frontend: FrontEnd | None, sent_s: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """After a closed-loop simulation: when each request reached the engine and when the
    client sent it (a later turn's: its engine arrival less the front end's way in)."""
    rows = raw.sort_values(VIDUR_ID, kind="stable")
    arrived = rows[ARRIVED].to_numpy(dtype=float)
    sent = np.asarray(sent_s, dtype=float).copy()
    later = np.isnan(sent)
    sent[later] = arrived[later] - _idle_input_s(frontend)
    return arrived, sent


def _idle_input_s(frontend: FrontEnd | None) -> float:
    return float(frontend.input_delays_s(np.zeros(1))[0]) if frontend is not None else 0.0


def _output_s(frontend: FrontEnd | None) -> float:
    return frontend.output_ms / 1000.0 if frontend is not None else 0.0
