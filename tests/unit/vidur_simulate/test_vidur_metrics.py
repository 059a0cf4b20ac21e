"""Vidur's request rows: the exact-replay check and the mapping to REQUEST_METRICS."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.io.artifacts import validate_frame
from gpu_simulate_test.io.schemas import REQUEST_METRICS
from gpu_simulate_test.vidur_simulate.metrics import (
    ENGINE_QUEUED_DELAY,
    EXTRA_COLUMNS,
    ReplayMismatchError,
    check_replay,
    normalize,
    summarize,
)

PREFILL = np.array([100, 200, 50])
DECODE = np.array([10, 1, 5])
ARRIVALS = np.array([0.0, 0.25, 1.0])


def vidur_rows(**changes: Any) -> pd.DataFrame:
    rows = pd.DataFrame(
        {
            "Request Id": [2, 0, 1],  # Vidur does not promise an order
            "request_e2e_time": [0.5, 0.2, 0.3],
            "request_execution_time": [0.4, 0.2, 0.3],
            "request_preemption_time": [0.0, 0.0, 0.0],
            "request_scheduling_delay": [0.1, 0.0, 0.0],
            "prefill_e2e_time": [0.1, 0.02, 0.3],
            "decode_time_execution_plus_preemption_normalized": [0.08, 0.018, 0.0],
            "request_inter_arrival_delay": [0.75, np.nan, 0.25],
            "request_num_prefill_tokens": [50, 100, 200],
            "request_num_decode_tokens": [5, 10, 1],
            "request_num_restarts": [0, 0, 0],
        }
    )
    for column, value in changes.items():
        rows[column] = value
    return rows


def test_rows_are_joined_by_request_order_and_normalized() -> None:
    rows = check_replay(vidur_rows(), PREFILL, DECODE, ARRIVALS, "x")
    table = normalize(rows, PREFILL, DECODE, ARRIVALS)
    checked = validate_frame(table, REQUEST_METRICS)
    assert list(table.columns) == [
        *REQUEST_METRICS.column_names,
        ENGINE_QUEUED_DELAY,
        *EXTRA_COLUMNS,
    ]
    assert checked["request_id"].tolist() == [0, 1, 2]
    assert table["ttft_s"].tolist() == [0.02, 0.3, 0.1]
    assert table["e2e_s"].tolist() == [0.2, 0.3, 0.5]
    # TPOT excludes the first token: (e2e - ttft) / (output - 1); undefined for one token
    assert table["tpot_s"].iloc[0] == pytest.approx((0.2 - 0.02) / 9)
    assert np.isnan(table["tpot_s"].iloc[1])
    assert table["tpot_s"].iloc[2] == pytest.approx((0.5 - 0.1) / 4)
    assert table["first_token_time_s"].tolist() == pytest.approx([0.02, 0.55, 1.1])
    assert table["last_token_time_s"].tolist() == pytest.approx([0.2, 0.55, 1.5])
    assert (table["status"] == "ok").all()
    summary = summarize(table)
    assert summary["makespan_s"] == pytest.approx(1.5)
    assert summary["throughput_output_tokens_per_s"] == pytest.approx(16 / 1.5)
    assert table["frontend_input_s"].isna().all()  # no front end given: not split


def test_the_front_end_is_split_into_its_hops() -> None:
    # 3 ms in, then 5 ms back for the first token; request 2 held 40 ms behind a running step
    rows = check_replay(vidur_rows(), PREFILL, DECODE, ARRIVALS, "x")
    held = np.array([0.0, 0.0, 0.04])
    first = np.array([0.005, 0.005, 0.005])
    table = normalize(rows, PREFILL, DECODE, ARRIVALS, 0.003 + first, held, None, first)
    assert table["frontend_input_s"].tolist() == pytest.approx([0.003] * 3)
    assert table["held_back_s"].tolist() == pytest.approx([0.0, 0.0, 0.04])
    assert table["frontend_first_token_s"].tolist() == pytest.approx([0.005] * 3)
    # the parts add up to the front end's share, and the engine's part is the rest of TTFT
    parts = table[["frontend_input_s", "held_back_s", "frontend_first_token_s"]].sum(axis=1)
    assert parts.tolist() == pytest.approx(table["frontend_delay_s"].tolist())
    assert table["ttft_s"].tolist() == pytest.approx([0.028, 0.308, 0.108])
    assert table["frontend_last_token_s"].tolist() == pytest.approx([0.005] * 3)  # no queue
    # the front end as a queue: the last token's way back apart from the first's
    last = np.array([0.009, 0.005, 0.012])
    apart = normalize(rows, PREFILL, DECODE, ARRIVALS, 0.003 + first, held, 0.003 + last, first)
    assert apart["frontend_last_token_s"].tolist() == pytest.approx(last.tolist())
    assert apart["frontend_first_token_s"].tolist() == pytest.approx(first.tolist())


def test_a_missing_request_is_named() -> None:
    rows = vidur_rows().iloc[:2]
    with pytest.raises(ReplayMismatchError, match=r"simulated 2 of 3 requests; missing .*\[1\]"):
        check_replay(rows, PREFILL, DECODE, ARRIVALS, "x")


def test_other_lengths_are_named() -> None:
    rows = vidur_rows(request_num_prefill_tokens=[50, 99, 200])
    with pytest.raises(ReplayMismatchError, match=r"request 0 was simulated with 99 prompt"):
        check_replay(rows, PREFILL, DECODE, ARRIVALS, "x")


def test_a_restarted_request_keeps_its_total_length() -> None:
    # restarted after 3 decoded tokens: Vidur re-prefills 103 and decodes the remaining 7
    ok = vidur_rows(
        request_num_prefill_tokens=[50, 103, 200],
        request_num_decode_tokens=[5, 7, 1],
        request_num_restarts=[0, 1, 0],
    )
    check_replay(ok, PREFILL, DECODE, ARRIVALS, "x")
    bad = ok.assign(request_num_decode_tokens=[5, 8, 1])
    with pytest.raises(ReplayMismatchError, match=r"request 0"):
        check_replay(bad, PREFILL, DECODE, ARRIVALS, "x")


def test_other_arrival_gaps_are_named() -> None:
    rows = vidur_rows(request_inter_arrival_delay=[0.75, np.nan, 0.2])
    with pytest.raises(ReplayMismatchError, match=r"request 1 arrived 0.200000000 s after"):
        check_replay(rows, PREFILL, DECODE, ARRIVALS, "x")
