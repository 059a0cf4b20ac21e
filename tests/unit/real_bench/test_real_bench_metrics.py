"""Metric math of the real bench on hand-built records with hand-computed values."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from gpu_simulate_test.core.engines.records import RequestRecord
from gpu_simulate_test.io.artifacts import read_csv, write_csv
from gpu_simulate_test.io.schemas import REQUEST_METRICS
from gpu_simulate_test.real_bench.metrics import (
    distribution_ms,
    gaps_s,
    is_monotonic,
    pooled_itls_s,
    request_frame,
    request_row,
    summarize,
    token_frame,
    token_rows,
    tpot_s,
)


def record(
    rid: int,
    arrival: float | None,
    times: list[float],
    counts: list[int] | None = None,
    status: str = "ok",
    expected: int | None = None,
    prefill: int = 10,
) -> RequestRecord:
    counts = counts if counts is not None else [1] * len(times)
    return RequestRecord(
        request_id=rid,
        num_prefill_tokens=prefill,
        expected_decode_tokens=expected if expected is not None else sum(counts),
        scheduled_arrival_s=arrival if arrival is not None else 0.0,
        arrival_s=arrival,
        event_times_s=times,
        event_num_tokens=counts,
        status=status,
    )


def test_ttft_tpot_e2e_of_one_request() -> None:
    # arrives at 1.0, tokens at 1.5, 1.7, 2.0: ttft 0.5, e2e 1.0, tpot (1.0-0.5)/2 = 0.25
    row = request_row(record(0, 1.0, [1.5, 1.7, 2.0]))
    assert row["ttft_s"] == pytest.approx(0.5)
    assert row["e2e_s"] == pytest.approx(1.0)
    assert row["tpot_s"] == pytest.approx(0.25)
    assert row["num_decode_tokens"] == 3 and row["num_events"] == 3
    assert row["first_token_time_s"] == 1.5 and row["last_token_time_s"] == 2.0
    assert row["token_count_mismatch"] is False


def test_tpot_with_one_output_token_is_nan() -> None:
    assert math.isnan(tpot_s(0.3, 0.3, 1))
    assert math.isnan(tpot_s(0.3, 0.3, 0))
    row = request_row(record(0, 0.0, [0.3]))
    assert row["ttft_s"] == pytest.approx(0.3) and math.isnan(row["tpot_s"])


def test_itl_pools_every_gap_of_every_request() -> None:
    a = record(0, 0.0, [0.1, 0.3, 0.6])  # gaps 0.2, 0.3
    b = record(1, 0.0, [0.2, 0.25])  # gap 0.05
    c = record(2, 0.0, [0.9])  # no gap
    assert gaps_s([0.1, 0.3, 0.6]) == pytest.approx([0.2, 0.3])
    assert sorted(pooled_itls_s([a, b, c])) == pytest.approx([0.05, 0.2, 0.3])


def test_multi_token_chunks_are_one_event_with_their_count() -> None:
    # an SSE chunk carrying 3 tokens: 4 tokens in 2 events
    rec = record(0, 0.0, [0.5, 0.9], counts=[1, 3])
    rows = token_rows(rec)
    assert [r["token_index"] for r in rows] == [0, 3]
    assert [r["num_tokens"] for r in rows] == [1, 3]
    assert math.isnan(rows[0]["itl_s"]) and rows[1]["itl_s"] == pytest.approx(0.4)
    # TPOT divides by output tokens - 1, not by events - 1
    assert request_row(rec)["tpot_s"] == pytest.approx(0.4 / 3)


def test_server_count_mismatch_is_flagged() -> None:
    rec = record(0, 0.0, [0.5, 0.9], counts=[1, 1], expected=3)
    rec.reported_decode_tokens = 3  # usage says 3, the stream showed 2
    row = request_row(rec)
    assert row["num_decode_tokens"] == 3 and row["token_count_mismatch"] is True


def test_engine_columns_come_with_engine_stamps() -> None:
    rec = record(0, 1.0, [1.5, 1.7])
    rec.engine_token_times_s = [1.4, 1.6]
    rec.engine_arrival_s = 1.01
    row = request_row(rec)
    assert row["engine_ttft_s"] == pytest.approx(0.39)  # from the engine's arrival
    assert row["engine_tpot_s"] == pytest.approx(0.2)
    rows = token_rows(rec)
    assert rows[1]["engine_itl_s"] == pytest.approx(0.2)
    without = request_row(record(1, 1.0, [1.5]))  # a backend without an engine clock
    assert math.isnan(without["engine_ttft_s"]) and math.isnan(without["engine_arrival_time_s"])


def test_frames_skip_requests_that_never_arrived() -> None:
    records = [record(0, 0.0, [0.1, 0.2]), record(1, None, [], status="pending")]
    assert request_frame(records)["request_id"].tolist() == [0]
    assert len(token_frame(records)) == 2
    assert list(request_frame([]).columns)[:2] == ["request_id", "arrival_time_s"]


def test_summary_counts_only_ok_requests_and_uses_vllm_keys() -> None:
    ok1 = record(0, 0.0, [0.5, 1.0, 1.5])  # ttft 0.5, e2e 1.5, tpot 0.5
    ok2 = record(1, 1.0, [2.0, 2.5])  # ttft 1.0, e2e 1.5, tpot 0.5
    bad = record(2, 1.5, [1.8], status="error", expected=4)
    bad.error = "boom"
    never = record(3, None, [], status="pending")
    s = summarize([ok1, ok2, bad, never])
    assert s["completed"] == 2 and s["failed"] == 1 and s["num_not_sent"] == 1
    assert s["duration"] == pytest.approx(2.5)
    assert s["total_output_tokens"] == 5 and s["total_input_tokens"] == 20
    assert s["output_throughput"] == pytest.approx(5 / 2.5)
    assert s["request_throughput"] == pytest.approx(2 / 2.5)
    assert s["mean_ttft_ms"] == pytest.approx(750.0)
    assert s["median_e2el_ms"] == pytest.approx(1500.0)
    assert s["mean_tpot_ms"] == pytest.approx(500.0)
    assert s["p99_itl_ms"] == pytest.approx(500.0)  # gaps 0.5, 0.5, 0.5
    assert s["errors"] == ["boom"]
    for key in (
        "p50_ttft_ms",
        "p90_tpot_ms",
        "std_itl_ms",
        "mean_e2el_ms",
        "total_token_throughput",
    ):
        assert key in s


def test_distribution_ignores_nan_and_is_nan_when_empty() -> None:
    d = distribution_ms([0.001, float("nan"), 0.003])
    assert d["mean"] == pytest.approx(2.0) and d["p50"] == pytest.approx(2.0)
    assert math.isnan(distribution_ms([])["p99"])


def test_monotonic() -> None:
    assert is_monotonic([0.1, 0.1, 0.2]) and not is_monotonic([0.2, 0.1])


def test_a_request_still_in_flight_when_written_is_a_valid_cancelled_row(tmp_path: Path) -> None:
    """A second Ctrl-C during the cancel loop leaves a record pending; its row must still be
    written (the table's status column accepts only how a request ended)."""
    frame = request_frame([record(0, 0.0, [0.3, 0.5]), record(1, 0.1, [0.4], status="pending")])
    assert frame["status"].tolist() == ["ok", "cancelled"]
    write_csv(tmp_path / "request_metrics.csv", frame, REQUEST_METRICS)
    assert read_csv(tmp_path / "request_metrics.csv", REQUEST_METRICS)["status"].tolist() == [
        "ok",
        "cancelled",
    ]


def test_the_printed_summary_counts_the_requests_never_sent(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A closed loop's turns after a failed one are never sent: summary.json counts them
    (``num_not_sent``), and the printed table said only ok / failed."""
    from gpu_simulate_test.real_bench.report import print_summary

    records = [
        record(0, 0.0, [0.1, 0.2]),
        record(1, 0.1, [], status="error"),
        record(2, None, [], status="error"),
    ]
    print_summary(summarize(records), "t")
    out = capsys.readouterr().out
    assert re.search(r"requests ok / failed\s+│ 1 / 1 ", out)
    assert re.search(r"requests not sent\s+│ 1 ", out)
    print_summary(summarize(records[:2]), "t")
    assert "not sent" not in capsys.readouterr().out
