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

from gpu_simulate_test.vidur_simulate.metrics import VIDUR_ID


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
    arrived = np.asarray(arr)
    done = np.asarray(done_at)
    first = np.asarray(prefill_done, dtype=float)
    decodes = np.asarray(dec, dtype=np.int64)
    inter = np.full(len(arr), math.nan)
    inter[1:] = arrived[1:] - arrived[:-1]
    # a request that ran in one batch never added a wait: Vidur keeps its int 0
    preempt: Any = np.asarray(preempt_time, dtype=float)
    if not any(isinstance(x, float) for x in preempt_time):
        preempt = preempt.astype(np.int64)
    frame = pd.DataFrame(
        {
            VIDUR_ID: np.asarray(ids, dtype=np.int64),
            "request_e2e_time": done - arrived,
            "request_execution_time": np.asarray(exec_time, dtype=float),
            "request_preemption_time": preempt,
            "request_scheduling_delay": np.asarray(sched_at) - arrived,
            "prefill_e2e_time": first - arrived,
            "decode_time_execution_plus_preemption_normalized": (done - first) / decodes,
            "request_num_prefill_tokens": np.asarray(pre, dtype=np.int64),
            "request_num_decode_tokens": decodes,
            "request_num_restarts": np.zeros(len(arr), dtype=np.int64),
            "request_inter_arrival_delay": inter,
        }
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
    arrived = np.asarray(arr, dtype=float)
    finished = np.asarray(done, dtype=float)
    first = np.asarray(first_token, dtype=float)
    sched = np.asarray(scheduled_at, dtype=float)
    busy = np.asarray(busy_s, dtype=float)
    outputs = np.asarray(max_out, dtype=np.int64)
    inter = np.full(len(arr), math.nan)  # Vidur's: from the previous request by id
    inter[1:] = arrived[1:] - arrived[:-1]
    return pd.DataFrame(
        {
            VIDUR_ID: np.arange(len(arr), dtype=np.int64),
            "request_e2e_time": finished - arrived,
            "request_execution_time": busy,
            "request_preemption_time": (finished - sched) - busy,
            "request_scheduling_delay": sched - arrived,
            "prefill_e2e_time": first - arrived,
            "decode_time_execution_plus_preemption_normalized": (finished - first) / outputs,
            "request_num_prefill_tokens": np.asarray(prompt, dtype=np.int64),
            "request_num_decode_tokens": outputs,
            "request_num_restarts": np.asarray(restarts, dtype=np.int64),
            "request_inter_arrival_delay": inter,
        }
    )
