"""The speed probe's arithmetic: the same requests every time, the drift between a real run's
probe and the calibration's, and when the comparison names it."""

from __future__ import annotations

import pytest

from gpu_simulate_test.core import speed_probe


def test_the_probe_sends_the_same_requests_every_time() -> None:
    first, again = speed_probe.probe_requests(1000), speed_probe.probe_requests(1000)
    assert first == again and len(first) == speed_probe.REPEATS
    assert {r.num_prefill_tokens for r in first} == {speed_probe.PROMPT_TOKENS}
    assert {r.num_decode_tokens for r in first} == {speed_probe.OUTPUT_TOKENS}
    assert all(r.request_id < -1_000_000 for r in first)  # apart from the warm-ups' ids
    assert len({r.request_id for r in first}) == len(first)
    assert all(0 <= t < 1000 for t in first[0].prompt_token_ids or ())


def test_host_speed_is_the_real_runs_probe_over_the_calibrations() -> None:
    calibration = {"ms_per_token": 10.0}
    speed = speed_probe.host_speed(calibration, {"ms_per_token": 12.0}, {"ms_per_token": 9.5})
    assert speed is not None
    assert speed["drift"] == pytest.approx(0.2) and speed["repeat_drift"] == pytest.approx(-0.05)
    note = speed_probe.finding(speed)
    assert note is not None and "20% slower" in note and "lean fast" in note
    assert speed_probe.line(speed) == (
        "host speed since the calibration: +20.0% per token (repeat -5.0%)"
    )
    # within the note's limit: nothing named; either probe missing: nothing at all
    calm = speed_probe.host_speed(calibration, {"ms_per_token": 10.5})
    assert calm is not None and speed_probe.finding(calm) is None and "repeat" not in calm
    assert speed_probe.host_speed(None, {"ms_per_token": 10.0}) is None
    assert speed_probe.host_speed(calibration, None) is None
    assert speed_probe.host_speed(calibration, {"ms_per_token": 0.0}) is None
    assert speed_probe.line(None) == ""
