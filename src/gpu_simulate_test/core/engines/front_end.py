"""A vLLM server's front end, request by request: when its API server received each request and
when it handled the first output, from the request's OpenTelemetry span (``front_end_stamps.csv``).

The span starts when the API server takes the request in and carries the time to its first
output (vLLM's ``time_to_first_token``, measured in the API server), both on the wall clock. The
real bench turns them into the run clock as it does the engine's stamps (:mod:`.otlp`), so that
with the client's send and receipt and the engine's queueing and first token each first token's
time splits into its hops (:mod:`gpu_simulate_test.compare.ttft_parts`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd

from gpu_simulate_test.core.engines.otlp import RequestSpan
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import write_csv
from gpu_simulate_test.io.schemas import FRONT_END_STAMPS


def front_end_frame(
    spans: Mapping[int, RequestSpan], wall_minus_perf_s: float, rel: Callable[[float], float]
) -> pd.DataFrame:
    """Each request's API-server stamps on the run clock: ``rel`` maps a ``perf_counter()``
    reading to the run clock, ``wall_minus_perf_s`` is ``time.time() − time.perf_counter()``."""
    rows = [
        {
            "request_id": rid,
            "front_arrival_time_s": rel(span.front_arrival_wall_s - wall_minus_perf_s),
            "front_first_token_time_s": rel(
                span.front_arrival_wall_s + span.front_ttft_s - wall_minus_perf_s
            ),
        }
        for rid, span in sorted(spans.items())
    ]
    return pd.DataFrame(rows, columns=FRONT_END_STAMPS.column_names)


def write_front_end(
    run_dir: Path,
    spans: Mapping[int, RequestSpan],
    wall_minus_perf_s: float,
    rel: Callable[[float], float],
) -> int:
    """``front_end_stamps.csv`` in ``run_dir`` (nothing without spans); returns its rows."""
    if not spans:
        return 0
    frame = front_end_frame(spans, wall_minus_perf_s, rel)
    write_csv(run_dir / layout.FRONT_END_STAMPS, frame, FRONT_END_STAMPS)
    return len(frame)
