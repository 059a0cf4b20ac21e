"""The step record of vLLM's own scheduler, read back: every step and every request's stamps.

A vLLM server started with ``--scheduler-cls`` :data:`SCHEDULER_CLS` and :data:`ENV` set to a
file writes one JSON line per queued request and per engine step on the engine core's clock
(:mod:`.vllm_recording_scheduler`, which imports vLLM; this module does not). :func:`read_record`
keeps one run's part of it: its requests are told by the tag our client gives their ids
(:func:`.otlp.request_tag`), its steps run from the first step with one of them to the last.

From it come, exactly and on one clock: each request's engine stamps (queued, first scheduled,
every token, finished: what vLLM's own metrics stamp; and its prefix-cache hit at first
admission, where the record has hits) and the ``engine_schedule`` table (one row
per step: when it was scheduled and when its outputs were made, its requests with their tokens
and vLLM's context/generation split, preemptions, the queue). The oracle replay and the
step-by-step comparison read that table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE, FLEET_COLUMN

ENV = "GST_ENGINE_STEPS"
"""The environment variable naming the file the recording scheduler appends to."""
SCHEDULER_CLS = "gpu_simulate_test.core.engines.vllm_recording_scheduler.RecordingScheduler"
"""vLLM's ``--scheduler-cls`` for the recording scheduler (with ``--no-async-scheduling``: it is
vLLM's synchronous ``Scheduler``)."""
STEPS_FILE = "engine_steps.jsonl"
"""The record's name beside the server's log."""
ENGINE = FLEET_COLUMN.name
"""The column of a data-parallel server's engine (``io.schemas.FLEET_COLUMN``)."""
FOREIGN = "x"
"""The request id the ``requests`` column gives a request of another run."""
SCHEDULE_COLUMNS: tuple[str, ...] = tuple(c.name for c in ENGINE_SCHEDULE.columns)
"""The ``engine_schedule`` table's columns, in order (a recorded or a simulated schedule)."""
COMPOSITION: tuple[str, ...] = (
    "num_prefill_requests",
    "num_prefill_tokens",
    "num_decode_requests",
    "num_decode_tokens",
)
"""What makes two steps the same: vLLM's context and generation requests and tokens."""


def parse_requests(text: object) -> list[tuple[str, int]]:
    """A ``requests`` cell (``request_id:tokens``, space-separated) as (id, tokens) pairs."""
    out = []
    for item in str(text or "").split():
        rid, tokens = item.rsplit(":", 1)
        out.append((rid, int(tokens)))
    return out


def step_log_rows(schedule: pd.DataFrame, timed: bool) -> pd.DataFrame:
    """A schedule as ``engine_step_log`` rows: ``elapsed_ms`` from scheduling to outputs, and
    ``time_s`` when the outputs were made (``timed``) or empty (a simulation's, as Vidur's)."""
    fleet = {ENGINE: schedule[ENGINE]} if ENGINE in schedule.columns else {}
    return pd.DataFrame(
        {
            **fleet,
            "step_index": schedule["step_index"],
            "time_s": schedule["end_time_s"] if timed else np.nan,
            **{col: schedule[col] for col in COMPOSITION},
            "elapsed_ms": 1000.0 * (schedule["end_time_s"] - schedule["start_time_s"]),
            "kv_cache_usage_pct": np.nan,
        }
    )


@dataclass
class RequestStamps:
    """One request's engine stamps (``time.monotonic()`` of the engine core)."""

    queued: float | None = None
    scheduled: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished: float | None = None
    preemptions: int = 0
    cached_tokens: int | None = None
    """The prefix-cache hit at its first admission (None: a record without hits, or not seen
    admitted)."""
    engine: int | None = None
    """The engine that queued it (its data-parallel rank; None: not seen queued)."""


@dataclass(frozen=True)
class StepRecord:
    """One run's part of a record."""

    steps: pd.DataFrame
    """``engine_schedule`` rows (times still on the engine core's clock; see :meth:`table`)."""
    requests: dict[int, RequestStamps]
    """By our request id."""
    unreadable_lines: int
    foreign_requests: int
    """Requests of other runs in this run's steps (0 when the server served only this run)."""
    engines: int = 1
    """The server's engines (``--data-parallel-size``) as the record shows them."""

    def table(self, offset_s: float, origin: float) -> pd.DataFrame:
        """The ``engine_schedule`` table on the run clock: a ``time.monotonic()`` reading plus
        ``offset_s`` is a ``perf_counter`` one, minus ``origin`` the run's."""
        out = self.steps.copy()
        for col in ("start_time_s", "end_time_s"):
            out[col] = out[col] + offset_s - origin
        return out


def _tag_pattern(run_token: str) -> re.Pattern[str]:
    return re.compile(rf"(?:^|-)gst{re.escape(run_token)}-(\d+)(?:-[0-9a-f]+)*$")


def _lines(path: Path) -> tuple[list[dict[str, object]], int]:
    lines: list[dict[str, object]] = []
    bad = 0
    with open(path, encoding="utf-8") as handle:
        for raw in handle:
            if not raw.strip():
                continue
            try:
                value = json.loads(raw)
            except ValueError:  # a line cut by a stopped server is counted, not read
                bad += 1
                continue
            if isinstance(value, dict):
                lines.append(value)
            else:
                bad += 1
    return lines, bad


def read_record(path: Path, run_token: str, wanted: Iterable[int] | None = None) -> StepRecord:
    """One run's steps and request stamps from the record at ``path`` (its requests tagged with
    ``run_token``; with ``wanted``, only those request ids count as the run's).

    The engines of a data-parallel server (lines with ``"g"`` > 0 anywhere in the record) are
    read apart: each engine's steps from its first step with one of the run's requests to its
    last, numbered from 0 per engine; the table gets an ``engine`` column and is ordered by
    start time, then engine (as a simulated fleet's), and each request the engine that queued
    it."""
    pattern = _tag_pattern(run_token)
    keep = set(wanted) if wanted is not None else None
    lines, bad = _lines(path)
    ids: dict[str, int | None] = {}

    def ours(engine_id: str) -> int | None:
        if engine_id not in ids:
            found = pattern.search(engine_id)
            rid = int(found.group(1)) if found else None
            ids[engine_id] = rid if rid is not None and (keep is None or rid in keep) else None
        return ids[engine_id]

    requests: dict[int, RequestStamps] = {}
    step_lines: dict[int, list[dict[str, object]]] = {}
    engines = 1
    for line in lines:
        engine = int(line.get("g", 0))  # type: ignore[call-overload]
        engines = max(engines, engine + 1)
        if "q" in line:
            rid = ours(str(line["q"]))
            if rid is not None:
                stamps = requests.setdefault(rid, RequestStamps())
                stamps.queued, stamps.engine = float(line["t"]), engine  # type: ignore[arg-type]
        elif "s" in line and "e" in line:
            step_lines.setdefault(engine, []).append(line)
    rows: list[dict[str, object]] = []
    foreign: set[str] = set()
    for engine in sorted(step_lines):
        window = _run_window(step_lines[engine], ours)
        for index, line in enumerate(window):
            row = _step_row(index, line, ours, requests, foreign)
            rows.append({ENGINE: engine, **row} if engines > 1 else row)
    columns = [ENGINE, *SCHEDULE_COLUMNS] if engines > 1 else list(SCHEDULE_COLUMNS)
    steps = pd.DataFrame(rows, columns=columns)
    if engines > 1:
        steps = steps.sort_values(["start_time_s", ENGINE], kind="stable").reset_index(drop=True)
    return StepRecord(
        steps=steps,
        requests=requests,
        unreadable_lines=bad,
        foreign_requests=len(foreign),
        engines=engines,
    )


def _run_window(lines: list[dict[str, object]], ours: object) -> list[dict[str, object]]:
    """The steps from the first with one of the run's requests to the last (none: empty)."""
    marked = [
        i
        for i, line in enumerate(lines)
        if any(ours(str(row[0])) is not None for row in line["r"])  # type: ignore[attr-defined, operator]
    ]
    return lines[marked[0] : marked[-1] + 1] if marked else []


def _step_row(
    index: int,
    line: dict[str, object],
    ours: object,
    requests: dict[int, RequestStamps],
    foreign: set[str],
) -> dict[str, object]:
    start, end = float(line["s"]), float(line["e"])  # type: ignore[arg-type]
    counts = [0, 0, 0, 0]  # prefill requests, tokens; decode requests, tokens
    names: list[str] = []
    for row in line["r"]:  # type: ignore[attr-defined]
        engine_id, tokens, context = str(row[0]), int(row[1]), int(row[2])
        emitted = int(row[3]) if len(row) > 3 else 0
        finished = bool(row[4]) if len(row) > 4 else False
        side = 0 if context else 2
        counts[side] += 1
        counts[side + 1] += tokens
        rid = ours(engine_id)  # type: ignore[operator]
        if rid is None:
            foreign.add(engine_id)
            names.append(f"{FOREIGN}:{tokens}")
            continue
        names.append(f"{rid}:{tokens}")
        stamps = requests.setdefault(rid, RequestStamps())
        if stamps.scheduled is None:
            stamps.scheduled = start
        stamps.token_times.extend([end] * emitted)
        if finished:
            stamps.finished = end
    for engine_id in line.get("p", ()):  # type: ignore[attr-defined]
        rid = ours(str(engine_id))  # type: ignore[operator]
        if rid is not None:
            requests.setdefault(rid, RequestStamps()).preemptions += 1
    for engine_id, hit in dict(line.get("h") or {}).items():  # type: ignore[call-overload]
        rid = ours(str(engine_id))  # type: ignore[operator]
        if rid is not None:
            requests.setdefault(rid, RequestStamps()).cached_tokens = int(hit)
    return {
        "step_index": index,
        "start_time_s": start,
        "end_time_s": end,
        "num_prefill_requests": counts[0],
        "num_prefill_tokens": counts[1],
        "num_decode_requests": counts[2],
        "num_decode_tokens": counts[3],
        "num_preempted": len(line.get("p", ())),  # type: ignore[arg-type]
        "num_waiting": int(line.get("w", 0)),  # type: ignore[call-overload]
        "num_running": int(line.get("n", 0)),  # type: ignore[call-overload]
        "requests": " ".join(names),
    }
