"""Import a real trace CSV (Vidur's processed-trace format) with clear errors on bad rows; a
multi-turn trace (the session columns,
:data:`gpu_simulate_test.core.traffic.sessions.SESSION_KEYS`) is checked as a workload's sessions
are (:func:`gpu_simulate_test.core.traffic.sessions.check_sessions`); a Mooncake-format trace
(JSONL with hash ids, :mod:`.mooncake`) is read by its own reader. Then the trace's arrivals, or
generated ones, rescaled on request (:func:`trace_arrivals`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.config.schema import ConfigError, WorkloadConfig
from gpu_simulate_test.core.traffic.mooncake import PromptBlocks, is_mooncake, load_mooncake
from gpu_simulate_test.core.traffic.sampling import rescale_to_qps, sample_arrivals
from gpu_simulate_test.core.traffic.sessions import (
    SESSION_KEYS,
    Sessions,
    check_session_arrivals,
    check_sessions,
    sessions_from_frame,
    take_sessions,
)
from gpu_simulate_test.io.artifacts import ArtifactError, read_csv_text, validate_frame
from gpu_simulate_test.io.schemas import TRACE_IMPORT, TRACE_IMPORT_ARRIVED_AT

TRACE_IMPORT_TIMED = dataclasses.replace(
    TRACE_IMPORT,
    name="trace_import_timed",
    columns=(TRACE_IMPORT_ARRIVED_AT, *TRACE_IMPORT.columns),
    sorted_by=TRACE_IMPORT_ARRIVED_AT.name,
)
TRACE_IMPORT_SESSIONS_TIMED = dataclasses.replace(
    TRACE_IMPORT_TIMED,
    name="trace_import_sessions_timed",
    columns=(dataclasses.replace(TRACE_IMPORT_ARRIVED_AT, nullable=True), *TRACE_IMPORT.columns),
)
"""A multi-turn trace with arrivals: only each session's turn 0 has one (checked after)."""
TRACE_EXPECTED = "a trace CSV (num_prefill_tokens, num_decode_tokens, optional arrived_at)"
"""What a trace file should be, for error messages."""


@dataclass(frozen=True)
class ImportedTrace:
    """Lengths (and arrivals, when the trace has them) of the requests taken from a trace."""

    num_prefill_tokens: np.ndarray
    num_decode_tokens: np.ndarray
    arrived_at_s: np.ndarray | None
    total_rows: int
    clipped_rows: int
    sessions: Sessions | None = None
    """A multi-turn trace's sessions (ids renumbered 0, 1, ... in order); ``arrived_at_s`` is then
    NaN on every turn >= 1."""
    blocks: PromptBlocks | None = None
    """A Mooncake trace's prompt blocks (hash ids): which prompts share which blocks."""


def load_trace(
    path: Path | str,
    max_requests: int,
    max_context: int,
    clip_to_max_context: bool,
    block_tokens: int | None = None,
) -> ImportedTrace:
    """Read ``path``, take the first ``max_requests`` rows (0: all) and check every length.

    Lengths whose sum exceeds ``max_context`` fail (naming the row) unless clipping is on, in
    which case the output is shortened first, then the prompt. A multi-turn trace takes the first
    ``max_requests`` sessions, every row checked first; it is never clipped. A Mooncake trace
    (:func:`.mooncake.is_mooncake`) has its blocks rescaled to ``block_tokens`` tokens each
    (None: its own 512), a setting no CSV trace takes.
    """
    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"workload.trace_file={p}: file does not exist")
    if is_mooncake(p):
        mooncake = load_mooncake(p, max_requests, max_context, clip_to_max_context, block_tokens)
        return ImportedTrace(
            mooncake.num_prefill_tokens,
            mooncake.num_decode_tokens,
            mooncake.arrived_at_s,
            mooncake.total_rows,
            mooncake.clipped_rows,
            blocks=mooncake.blocks,
        )
    if block_tokens is not None:
        raise ConfigError(
            f"workload.trace_block_tokens={block_tokens} rescales a Mooncake trace's hash-id "
            f"blocks; {p} is a CSV trace (a Mooncake trace is JSONL, named *.jsonl)"
        )
    frame = read_csv_text(p, TRACE_EXPECTED)
    total_rows = len(frame)
    if total_rows == 0:
        raise ArtifactError(f"{p}: trace has a header but no rows")
    timed = TRACE_IMPORT_ARRIVED_AT.name in frame.columns
    if any(key in frame.columns for key in SESSION_KEYS):
        return _load_sessions(p, frame, timed, max_requests, max_context)
    if max_requests:
        frame = frame.head(max_requests)
    checked = validate_frame(frame, TRACE_IMPORT_TIMED if timed else TRACE_IMPORT, where=str(p))
    prefill = checked["num_prefill_tokens"].to_numpy(dtype=np.int64).copy()
    decode = checked["num_decode_tokens"].to_numpy(dtype=np.int64).copy()
    too_long = np.flatnonzero(prefill + decode > max_context)
    if too_long.size and not clip_to_max_context:
        row = int(too_long[0])
        raise ArtifactError(
            f"{p}: row {row + 1}: num_prefill_tokens + num_decode_tokens = "
            f"{prefill[row] + decode[row]} exceeds the model's max context {max_context} "
            f"({too_long.size} such row(s)); pass workload.clip_to_max_context=true to clip"
        )
    if too_long.size:
        decode = np.minimum(decode, max_context - 1)
        prefill = np.minimum(prefill, max_context - decode)
    arrived = checked["arrived_at"].to_numpy(dtype=float) if timed else None
    return ImportedTrace(prefill, decode, arrived, total_rows, int(too_long.size))


def _load_sessions(
    path: Path, frame: pd.DataFrame, timed: bool, max_sessions: int, max_context: int
) -> ImportedTrace:
    """A multi-turn trace: every row checked (the session invariants too), then the first
    ``max_sessions`` sessions (0: all) taken."""
    where = str(path)
    schema = TRACE_IMPORT_SESSIONS_TIMED if timed else TRACE_IMPORT
    checked = validate_frame(frame, schema, where=where)
    sessions = sessions_from_frame(checked, where)
    assert sessions is not None  # the caller saw a session column
    prefill = checked["num_prefill_tokens"].to_numpy(dtype=np.int64)
    decode = checked["num_decode_tokens"].to_numpy(dtype=np.int64)
    check_sessions(where, sessions, prefill, decode, max_context)
    arrived = None
    if timed:
        arrived = checked[TRACE_IMPORT_ARRIVED_AT.name].to_numpy(dtype=float)
        check_session_arrivals(where, TRACE_IMPORT_ARRIVED_AT.name, arrived, sessions.turn)
    taken, rows = take_sessions(sessions, max_sessions)
    return ImportedTrace(
        prefill[:rows].copy(),
        decode[:rows].copy(),
        None if arrived is None else arrived[:rows].copy(),
        len(frame),
        0,
        taken,
    )


def trace_arrivals(
    trace: ImportedTrace, cfg: WorkloadConfig, arrival_rng: np.random.Generator
) -> tuple[np.ndarray, dict[str, Any]]:
    """Each request's arrival (s, from 0; a session's later turns NaN): the trace's own, or
    generated by ``workload.arrival`` at ``workload.qps``, then stretched to
    ``workload.trace_target_qps``; and notes for the meta (where they came from)."""
    sessions = trace.sessions
    notes: dict[str, Any] = {}
    if trace.arrived_at_s is not None:  # a session's later turns stay NaN
        starts = trace.arrived_at_s if sessions is None else trace.arrived_at_s[sessions.first_rows]
        starts = starts - starts[0]
        notes["arrivals_from"] = "trace"
    else:
        units = len(trace.num_prefill_tokens) if sessions is None else sessions.num_sessions
        starts = sample_arrivals(cfg.arrival, units, cfg.qps, arrival_rng)
        notes["arrivals_from"] = f"generated ({cfg.arrival.process}, qps={cfg.qps})"
    if cfg.trace_target_qps is not None:
        _check_rescalable(starts, cfg, str(notes["arrivals_from"]))
        starts = rescale_to_qps(starts, cfg.trace_target_qps)
        notes["rescaled_to_qps"] = cfg.trace_target_qps
    arrivals = starts if sessions is None else sessions.per_request(starts)
    return np.asarray(arrivals, dtype=float), notes


def _check_rescalable(arrivals: np.ndarray, cfg: WorkloadConfig, arrivals_from: str) -> None:
    """``trace_target_qps`` needs arrivals spread over time: a rate is (N - 1) / span."""
    if len(arrivals) > 1 and float(np.ptp(arrivals)) > 0:
        return
    if len(arrivals) <= 1:
        why = "one request has no arrival rate to set"
    else:
        why = f"its {len(arrivals)} arrivals all fall at one instant, with no time span to stretch"
    fix = (
        "give the trace distinct arrived_at times"
        if arrivals_from == "trace"
        else "set workload.qps to a finite rate"
    )
    raise ArtifactError(
        f"workload.trace_target_qps={cfg.trace_target_qps:g}: {cfg.trace_file} ({arrivals_from}): "
        f"{why}; drop trace_target_qps, or {fix}"
    )
