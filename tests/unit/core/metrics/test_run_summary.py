"""The one run summary (``core/metrics/summary.py``): seconds from the first scheduled arrival, for
the real bench and the simulator alike."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpu_simulate_test.core.engines.records import RequestRecord
from gpu_simulate_test.core.metrics.goodput import GoodputConfig
from gpu_simulate_test.core.metrics.summary import summarize_run
from gpu_simulate_test.real_bench import metrics as real_metrics
from gpu_simulate_test.vidur_simulate import metrics as vidur_metrics


def _record(i: int, scheduled: float, times: list[float]) -> RequestRecord:
    return RequestRecord(
        request_id=i, num_prefill_tokens=10, expected_decode_tokens=len(times),
        scheduled_arrival_s=scheduled, arrival_s=scheduled, event_times_s=times,
        event_num_tokens=[1] * len(times), status="ok",
    )  # fmt: skip


def test_span_runs_from_the_first_scheduled_arrival_to_the_last_token() -> None:
    run = summarize_run(
        scheduled_arrival_s=[2.0, 1.0, 3.0],
        last_token_s=[4.0, np.nan, 5.0],
        ttft_s=[0.1, 0.2],
        tpot_s=[0.01, np.nan],
        e2e_s=[1.0, 2.0],
        num_input_tokens=[5, 6],
        num_output_tokens=[3, 1],
        goals=GoodputConfig(e2el=1500.0),
    )
    assert (run.origin_s, run.span_s) == (1.0, 4.0)
    assert (run.num_requests, run.num_input_tokens, run.num_output_tokens) == (2, 11, 4)
    assert run.per_s(run.num_requests) == 0.5
    assert run.describe("ttft", scale=1e3).median == pytest.approx(150.0)
    assert run.describe("itl").count == 0 and math.isnan(run.describe("itl").mean)
    assert run.goodput is not None and run.goodput["good_requests"] == 1
    empty = summarize_run(
        scheduled_arrival_s=[], last_token_s=[], ttft_s=[], tpot_s=[], e2e_s=[],
        num_input_tokens=[], num_output_tokens=[],
    )  # fmt: skip
    assert (empty.span_s, empty.goodput) == (0.0, None) and math.isnan(empty.per_s(1))


def test_real_and_simulated_runs_share_the_span_and_the_distributions() -> None:
    """The same requests, as a real bench's records and as a simulated table: one span (the
    real file in ms and vLLM's keys, the simulated in s), one set of statistics."""
    records = [_record(0, 0.0, [0.2, 0.3, 0.5]), _record(1, 1.0, [1.4, 1.6, 2.0])]
    real = real_metrics.summarize(records)
    table = real_metrics.request_frame(records).assign(num_restarts=0)
    sim = vidur_metrics.summarize(table)
    assert real["duration"] == sim["makespan_s"] == 2.0
    assert real["request_throughput"] == sim["throughput_requests_per_s"] == 1.0
    assert real["p90_ttft_ms"] == pytest.approx(sim["ttft_s"]["p90"] * 1e3)
    assert real["mean_e2el_ms"] == pytest.approx(sim["e2e_s"]["mean"] * 1e3)
