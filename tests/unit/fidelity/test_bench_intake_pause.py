"""bench_intake_pause: the pauses before busy steps that take a request in and the others, and
the clock rows judged against the truth's repeat."""

from __future__ import annotations

import pandas as pd
import pytest
from benchmarks.fidelity.bench_intake_pause import clock_summary, pause_kinds


def test_pauses_are_split_by_whether_the_step_takes_a_request_in() -> None:
    # an idle wake, a decode 0.1 ms after, a prefill 1 ms after, a decode after a long idle
    schedule = pd.DataFrame(
        {
            "start_time_s": [0.0, 0.0101, 0.0211, 0.5],
            "end_time_s": [0.01, 0.02, 0.032, 0.51],
            "num_prefill_requests": [1, 0, 1, 0],
        }
    )
    kinds = pause_kinds(schedule)
    assert kinds["taking"]["pause_ms"] == [pytest.approx(1.1)]
    assert kinds["taking"]["step_ms"] == [pytest.approx(10.9)]
    assert kinds["quiet"]["pause_ms"] == [pytest.approx(0.1)]  # the long idle is no pause


def test_a_row_is_within_where_the_error_is_inside_max_10_percent_or_the_repeat() -> None:
    errors: list[dict[str, float | None]] = [
        {"client/ttft/p50": 0.12, "client/ttft/p99": 0.5},
        {"client/ttft/p50": -0.05},
    ]
    noise: list[dict[str, float | None]] = [{"client/ttft/p50": -0.15}, {"client/ttft/p50": None}]
    summary = clock_summary(errors, noise)
    assert set(summary) == {"client/ttft/p50"}  # p50 and p90 only
    row = summary["client/ttft/p50"]
    assert row["runs"] == 2 and row["within"] == 2 and row["mean"] == pytest.approx(0.035)
    tight_noise: list[dict[str, float | None]] = [{"client/ttft/p50": 0.01}, {}]
    tight = clock_summary(errors, tight_noise)["client/ttft/p50"]
    assert tight["within"] == 1
