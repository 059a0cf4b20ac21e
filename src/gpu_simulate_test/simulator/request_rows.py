"""Vidur's per-request rows (``request_metrics.csv``) from our loops' records.

Both our loops write the columns Vidur's ``MetricsStore._on_request_end`` writes, with Vidur's
expressions, so that everything downstream (the replay check, the normalized table) reads one
format whichever loop ran: :func:`aggregate_loop_rows` for :mod:`.event_loop` (the same bytes
as Vidur's own loop), :func:`v1_rows` for :mod:`.vllm_v1`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

VIDUR_ID = "Request Id"
"""Vidur's request id column."""


def aggregate_loop_rows(
    ids: list[int],
    arr: list[float],
    pre: list[int],
    dec: list[int],
    sched_at: list[float],
    prefill_done: list[float],
    done_at: list[float],
    exec_time: list[float],
    preempt_time: list[float],
) -> pd.DataFrame:
    """Vidur's expressions over :mod:`.event_loop`'s records, which are by arrival rank
    (``ids``: each rank's request id); the rows come out by request id."""
    # a request that ran in one batch never added a wait: Vidur keeps its int 0
    preempt: Any = np.asarray(preempt_time, dtype=float)
    if not any(isinstance(x, float) for x in preempt_time):
        preempt = preempt.astype(np.int64)
    frame = _vidur_rows(
        ids=np.asarray(ids, dtype=np.int64),
        arrived=np.asarray(arr),
        scheduled=np.asarray(sched_at),
        first=np.asarray(prefill_done, dtype=float),
        done=np.asarray(done_at),
        execution=np.asarray(exec_time, dtype=float),
        preemption=preempt,
        prefill=np.asarray(pre, dtype=np.int64),
        decodes=np.asarray(dec, dtype=np.int64),
        restarts=np.zeros(len(arr), dtype=np.int64),
    )
    return frame.sort_values(VIDUR_ID, kind="stable").reset_index(drop=True)


def v1_rows(
    arr: list[float],
    prompt: list[int],
    max_out: list[int],
    scheduled_at: list[float],
    first_token: list[float],
    done: list[float],
    busy_s: list[float],
    restarts: list[int],
) -> pd.DataFrame:
    """Vidur's columns from :mod:`.vllm_v1`'s records (by request id): execution is the time
    in steps, preemption the rest after first scheduled."""
    finished = np.asarray(done, dtype=float)
    sched = np.asarray(scheduled_at, dtype=float)
    busy = np.asarray(busy_s, dtype=float)
    return _vidur_rows(
        ids=np.arange(len(arr), dtype=np.int64),
        arrived=np.asarray(arr, dtype=float),
        scheduled=sched,
        first=np.asarray(first_token, dtype=float),
        done=finished,
        execution=busy,
        preemption=(finished - sched) - busy,
        prefill=np.asarray(prompt, dtype=np.int64),
        decodes=np.asarray(max_out, dtype=np.int64),
        restarts=np.asarray(restarts, dtype=np.int64),
    )


def inter_arrival_s(arrived: np.ndarray) -> np.ndarray:
    """Each record's delay since the previous arrival in time, as Vidur's
    ``_on_request_arrival`` takes them (ties in record order; the first arrival's NaN): records
    out of arrival order give no negative delays."""
    inter = np.full(len(arrived), math.nan)
    order = np.argsort(arrived, kind="stable")
    inter[order[1:]] = arrived[order[1:]] - arrived[order[:-1]]
    return inter


def _vidur_rows(
    *,
    ids: np.ndarray,
    arrived: np.ndarray,
    scheduled: np.ndarray,
    first: np.ndarray,
    done: np.ndarray,
    execution: np.ndarray,
    preemption: Any,
    prefill: np.ndarray,
    decodes: np.ndarray,
    restarts: np.ndarray,
) -> pd.DataFrame:
    """Vidur's eleven columns, in its order and with its expressions, one row per record in the
    records' order (the inter-arrival delay: :func:`inter_arrival_s`)."""
    inter = inter_arrival_s(arrived)
    return pd.DataFrame(
        {
            VIDUR_ID: ids,
            "request_e2e_time": done - arrived,
            "request_execution_time": execution,
            "request_preemption_time": preemption,
            "request_scheduling_delay": scheduled - arrived,
            "prefill_e2e_time": first - arrived,
            "decode_time_execution_plus_preemption_normalized": (done - first) / decodes,
            "request_num_prefill_tokens": prefill,
            "request_num_decode_tokens": decodes,
            "request_num_restarts": restarts,
            "request_inter_arrival_delay": inter,
        }
    )
