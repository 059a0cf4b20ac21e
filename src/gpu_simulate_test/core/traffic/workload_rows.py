"""A workload run's rows as read back, checked against each other and against its
``workload_meta.json``: the checks a later stage makes before it trusts them."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.core.traffic.sessions import (
    Sessions,
    check_session_arrivals,
    check_sessions,
    sessions_from_frame,
)
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError


def check_rows(
    p: Path, meta: Mapping[str, Any], lengths: pd.DataFrame, intervals: pd.DataFrame
) -> Sessions | None:
    """Fail, naming the file, on rows no complete workload run holds: none, fewer or more than
    its meta counts, request ids that differ between the two files, an arrival left empty
    outside a session; returns the sessions of a multi-turn workload (None without)."""
    if lengths.empty:
        raise ArtifactError(
            f"{p / layout.TRACE_LENGTHS}: no rows (headers only); expected one row a request"
        )
    counted = (meta.get("summary") or {}).get("num_requests")
    if isinstance(counted, int) and counted != len(lengths):
        raise ArtifactError(
            f"{p / layout.TRACE_LENGTHS}: {len(lengths)} rows, but {layout.WORKLOAD_META} field "
            f"'summary.num_requests' is {counted}; expected one row a request (a file cut short "
            "or edited: write the workload again)"
        )
    if not lengths["request_id"].equals(intervals["request_id"]):
        raise ArtifactError(
            f"{p}: request_id of {layout.TRACE_LENGTHS} and {layout.TRACE_INTERVALS} differ"
        )
    sessions = sessions_from_frame(lengths, str(p / layout.TRACE_LENGTHS))
    arrivals = intervals["arrival_time_s"].to_numpy(dtype=float)
    if sessions is None:
        empty = np.flatnonzero(np.isnan(arrivals))
        if empty.size:
            raise ArtifactError(
                f"{p / layout.TRACE_INTERVALS}: row {int(empty[0]) + 1}, column 'arrival_time_s': "
                f"empty value (only a session's turn >= 1 has none, and {layout.TRACE_LENGTHS} "
                "has no sessions)"
            )
    else:
        check_sessions(
            str(p / layout.TRACE_LENGTHS),
            sessions,
            lengths["num_prefill_tokens"].to_numpy(dtype=np.int64),
            lengths["num_decode_tokens"].to_numpy(dtype=np.int64),
            meta.get("max_context"),
        )
        check_session_arrivals(
            str(p / layout.TRACE_INTERVALS), "arrival_time_s", arrivals, sessions.turn
        )
    return sessions
