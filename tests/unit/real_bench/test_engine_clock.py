"""The engine's own clock: vLLM's stamps onto the run clock, and the metrics derived from them,
on hand-made timestamps with hand-computed values."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from gpu_simulate_test.core.engines.engine_clock import (
    ClockError,
    ClockLink,
    EngineStamps,
    engine_stamps,
    link_clocks,
    out_of_order,
)
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder, RequestRecord
from gpu_simulate_test.io.artifacts import ArtifactError, read_csv, write_csv
from gpu_simulate_test.io.schemas import ENGINE_CLOCK_COLUMNS, FLEET_COLUMN, REQUEST_METRICS
from gpu_simulate_test.real_bench.metrics import (
    engine_columns,
    request_frame,
    request_row,
    summarize,
)


# ---------------------------------------------------------------------------- the clocks
def test_another_process_reads_the_same_monotonic_clock_as_perf_counter() -> None:
    link = link_clocks()
    assert abs(link.offset_s) < 1e-3  # Linux: both are CLOCK_MONOTONIC
    assert 0 < link.check_window_s < 30


@pytest.mark.parametrize(
    "clock",
    [
        "time.monotonic() + 5",  # a clock five seconds off
        "time.time()",  # the wall clock: another epoch
    ],
)
def test_a_child_on_another_time_line_is_refused(clock: str) -> None:
    with pytest.raises(ClockError, match="cannot be put on the run clock"):
        link_clocks([sys.executable, "-c", f"import time; print(repr({clock}))"])


def test_engine_stamps_are_converted_by_the_offset_and_zero_is_unstamped() -> None:
    stats = SimpleNamespace(
        queued_ts=10.0, scheduled_ts=10.25, first_token_ts=11.0, last_token_ts=0.0
    )
    stamps = engine_stamps(stats, ClockLink(offset_s=0.5))
    assert stamps == EngineStamps(queued=10.5, scheduled=10.75, first_token=11.5, last_token=None)
    assert engine_stamps(None, ClockLink(0.0)) == EngineStamps(None, None, None, None)


def test_stamps_that_contradict_the_client_are_named() -> None:
    ok = EngineStamps(queued=1.002, scheduled=1.003, first_token=1.05, last_token=1.25)
    assert out_of_order(ok, submitted=1.0, first_seen=1.052, last_seen=1.251) == []
    early = EngineStamps(queued=0.99, scheduled=1.003, first_token=1.05, last_token=1.25)
    assert out_of_order(early, 1.0, 1.052, 1.251) == ["queued -0.010000 s after submitted"]
    late = EngineStamps(queued=1.002, scheduled=1.003, first_token=1.06, last_token=1.25)
    assert out_of_order(late, 1.0, 1.052, 1.251) == [
        "first token stamped 0.008000 s after the client saw it"
    ]
    swapped = EngineStamps(queued=1.003, scheduled=1.002, first_token=1.05, last_token=1.25)
    assert out_of_order(swapped, 1.0, 1.052, 1.251) == ["scheduled -0.001000 s after queued"]


def test_the_recorder_puts_engine_stamps_on_the_run_clock() -> None:
    recorder = Recorder([BenchRequest(0, 10, 5, 0.0)], origin=100.0)
    recorder.engine_times(0, arrival=100.002, scheduled=100.003, first_token=100.05, last_token=0)
    rec = recorder.snapshot()[0]
    assert rec.engine_arrival_s == pytest.approx(0.002)
    assert rec.engine_scheduled_s == pytest.approx(0.003)
    assert rec.engine_first_token_s == pytest.approx(0.05)
    assert rec.engine_last_token_s is None  # 0: not stamped


# ---------------------------------------------------------------------------- the metrics
def vllm_record(decode: int = 5) -> RequestRecord:
    """A request the client sent at 1.0 s and saw from 1.052 s, the engine queued at 1.002 s,
    scheduled at 1.003 s, stamped its first token at 1.05 s and its last at 1.25 s."""
    return RequestRecord(
        request_id=0,
        num_prefill_tokens=10,
        expected_decode_tokens=decode,
        scheduled_arrival_s=1.0,
        arrival_s=1.0,
        event_times_s=[1.052 + 0.05 * i for i in range(decode)],
        event_num_tokens=[1] * decode,
        engine_arrival_s=1.002,
        engine_scheduled_s=1.003,
        engine_first_token_s=1.05,
        engine_last_token_s=1.25,
        status="ok",
    )


def test_engine_metrics_are_from_the_engine_arrival() -> None:
    row = engine_columns(vllm_record())
    assert row["engine_arrival_time_s"] == pytest.approx(1.002)
    assert row["engine_ttft_s"] == pytest.approx(0.048)  # 1.05 - 1.002
    assert row["engine_e2e_s"] == pytest.approx(0.248)  # 1.25 - 1.002
    assert row["engine_tpot_s"] == pytest.approx(0.05)  # (1.25 - 1.05) / (5 - 1)
    assert row["engine_scheduling_delay_s"] == pytest.approx(0.001)
    client = request_row(vllm_record())
    assert client["ttft_s"] - row["engine_ttft_s"] == pytest.approx(0.004)  # the front end


def test_engine_tpot_is_undefined_for_one_token_and_all_is_nan_without_stamps() -> None:
    assert math.isnan(engine_columns(vllm_record(decode=1))["engine_tpot_s"])
    bare = RequestRecord(0, 10, 2, 0.0, arrival_s=0.0, event_times_s=[0.1, 0.2])
    bare.event_num_tokens = [1, 1]
    assert all(math.isnan(v) for v in engine_columns(bare).values())
    assert set(engine_columns(bare)) == {c.name for c in ENGINE_CLOCK_COLUMNS}


def test_summary_has_engine_distributions_only_with_an_engine_clock() -> None:
    summary = summarize([vllm_record()])
    assert summary["engine_ttft_ms"]["median"] == pytest.approx(48.0)
    assert summary["engine_tpot_ms"]["p99"] == pytest.approx(50.0)
    assert summary["engine_scheduling_delay_ms"]["mean"] == pytest.approx(1.0)
    assert summary["ttft_minus_engine_ttft_ms"]["p50"] == pytest.approx(4.0)
    assert summary["engine_clock_requests"] == 1
    bare = RequestRecord(0, 10, 2, 0.0, arrival_s=0.0, event_times_s=[0.1, 0.2], status="ok")
    bare.event_num_tokens = [1, 1]
    assert not any(key.startswith("engine_") for key in summarize([bare]))


# ---------------------------------------------------------------------------- the table
def test_engine_columns_are_written_declared_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "request_metrics.csv"
    write_csv(path, request_frame([vllm_record()]), REQUEST_METRICS)
    table = read_csv(path, REQUEST_METRICS)
    # one engine: every optional column but the fleet's engine
    optional = [c for c in REQUEST_METRICS.optional_names if c != FLEET_COLUMN.name]
    names = REQUEST_METRICS.column_names + optional
    assert list(table.columns)[: len(names)] == names
    assert table["engine_ttft_s"].dtype == float  # declared: read as numbers, not text
    bad = request_frame([vllm_record()]).assign(engine_ttft_s=-0.001)
    with pytest.raises(ArtifactError, match=r"engine_ttft_s.*below the minimum"):
        write_csv(tmp_path / "bad.csv", bad, REQUEST_METRICS)


def test_a_table_written_before_the_engine_columns_still_loads(tmp_path: Path) -> None:
    path = tmp_path / "request_metrics.csv"
    old = request_frame([vllm_record()])[[*REQUEST_METRICS.column_names, "first_token_time_s"]]
    old.to_csv(path, index=False)
    table = read_csv(path, REQUEST_METRICS)
    assert "engine_ttft_s" not in table.columns and len(table) == 1
    assert isinstance(table, pd.DataFrame)


def test_time_perf_counter_is_time_monotonic_here() -> None:
    """What the conversion rests on, in this process (Linux: both CLOCK_MONOTONIC)."""
    before = time.perf_counter()
    mono = time.monotonic()
    after = time.perf_counter()
    assert before <= mono <= after


def test_the_engine_arrival_is_the_front_ends_not_the_schedulers() -> None:
    # vLLM's scheduler queues a request only between steps: a request that came in during a
    # 30 ms step is queued 30 ms later; Vidur's arrival is when it came in
    from types import SimpleNamespace

    from gpu_simulate_test.core.engines.engine_clock import ClockLink, engine_stamps

    link = ClockLink(offset_s=0.0, wall_offset_s=-1000.0)  # perf_counter = time.time() - 1000
    metrics = SimpleNamespace(
        arrival_time=1010.0, queued_ts=10.03, scheduled_ts=10.031,
        first_token_ts=10.05, last_token_ts=10.2,
    )  # fmt: skip
    stamps = engine_stamps(metrics, link)
    assert stamps.received == 10.0 and stamps.queued == 10.03
    assert stamps.arrival == 10.0
    no_front_end = engine_stamps(SimpleNamespace(queued_ts=10.03), link)
    assert no_front_end.arrival == 10.03  # only the scheduler's stamp: it stands in


def test_a_wall_clock_step_after_linking_is_followed_by_the_request_link(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the front end stamps its arrival with time.time(); NTP stepping the wall clock by 158 ms
    # between the link and a request (seen on a machine just booted) must not move the arrival
    link = ClockLink(offset_s=0.0, wall_offset_s=time.perf_counter() - time.time())
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 0.158)
    queued = time.monotonic()
    metrics = SimpleNamespace(arrival_time=time.time(), queued_ts=queued + 1e-4)
    stale = engine_stamps(metrics, link)
    assert stale.received is not None and stale.received - queued > 0.15  # the step shows
    fresh = engine_stamps(metrics, link.now())
    assert fresh.received is not None and abs(fresh.received - queued) < 0.05
    assert not out_of_order(fresh, queued - 1e-3, None, None)
