"""The front end from the engine's own stamps: every request a reading, a robust line, and the
iteration log's reading beside it as a check."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_simulate_test.core.engines.records import BenchRequest, Recorder
from gpu_simulate_test.vidur_profile.frontend import (
    checked,
    frontend_from_engine_clock,
    in_flight_at_send,
    theil_sen,
)


def recorder(sends: list[float], inputs_ms: list[float], output_ms: float, e2e: float) -> Recorder:
    requests = [
        BenchRequest(
            request_id=i, num_prefill_tokens=16, num_decode_tokens=4, scheduled_arrival_s=s
        )
        for i, s in enumerate(sends)
    ]
    rec = Recorder(requests)
    for i, (sent, delay) in enumerate(zip(sends, inputs_ms, strict=True)):
        r = rec.records[i]
        r.arrival_s = sent
        r.engine_arrival_s = sent + delay / 1000.0
        first = r.engine_arrival_s + 0.005
        r.engine_token_times_s = [first, first + 0.004]
        r.event_times_s = [first + output_ms / 1000.0, sent + e2e]
        r.event_num_tokens = [1, 1]
    return rec


def test_theil_sen_is_not_moved_by_one_wild_reading() -> None:
    x = [0, 0, 0, 1, 1, 2, 2, 3, 3]
    y = [3.0, 59.0, 3.1, 3.5, 3.4, 4.0, 4.1, 4.5, 4.4]  # one idle reading 20x the others
    intercept, slope = theil_sen(x, y)
    assert intercept == pytest.approx(3.0, abs=0.3) and slope == pytest.approx(0.5, abs=0.1)
    a, _slope = np.polyfit(x, y, 1)[::-1]
    assert a > 10  # what least squares made of it


def test_in_flight_counts_the_requests_sent_before_and_not_done() -> None:
    rec = recorder([0.0, 0.01, 0.02, 1.0], [3.0] * 4, 1.0, 0.1)
    assert in_flight_at_send(list(rec.records.values())) == [0, 1, 2, 0]


def test_the_stamped_front_end_recovers_input_output_and_growth() -> None:
    sends = [0.0, 0.001, 0.002, 0.003, 1.0, 1.001, 2.0, 3.0]
    running = [0, 1, 2, 3, 0, 1, 0, 0]
    inputs = [3.0 + 0.5 * n for n in running]
    inputs[6] = 59.0  # one late idle reading
    front = frontend_from_engine_clock(recorder(sends, inputs, 2.0, 0.1))
    assert front is not None and front["source"] == "engine stamps"
    assert front["input_ms"] == pytest.approx(3.0, abs=0.01)
    assert front["input_per_running_ms"] == pytest.approx(0.5, abs=0.01)
    assert front["output_ms"] == pytest.approx(2.0, abs=0.01)
    assert front["samples"]["0"] == 4 and front["requests"] == 8


def test_without_stamps_there_is_no_stamped_front_end() -> None:
    rec = recorder([0.0, 1.0, 2.0], [3.0] * 3, 1.0, 0.1)
    for r in rec.records.values():
        r.engine_arrival_s = None
    assert frontend_from_engine_clock(rec) is None


def test_the_check_says_whether_the_two_readings_agree() -> None:
    stamped = {"input_ms": 3.0, "input_per_running_ms": 0.5, "output_ms": 2.0}
    near = {"input_ms": 4.0, "input_per_running_ms": 0.0, "output_ms": 2.5}
    far = {"input_ms": 59.4, "input_per_running_ms": 0.0, "output_ms": 0.0}
    assert checked(stamped, near)["check"]["agree"] is True
    result = checked(stamped, far)["check"]
    assert result["agree"] is False and result["difference_ms"] == pytest.approx(54.4)
    assert checked(stamped, None)["check"] is None
