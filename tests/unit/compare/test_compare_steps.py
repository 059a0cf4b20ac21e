"""Engine steps, real vs simulated: grouping by composition and where the error lives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.compare.steps import compare_steps, step_cost_ms, step_group


def _steps(rows: list[tuple[int, int, int, float]]) -> pd.DataFrame:
    """(prefill requests, prefill tokens, decode requests, elapsed ms) per step."""
    return pd.DataFrame(
        {
            "step_index": range(len(rows)),
            "time_s": np.nan,
            "num_prefill_requests": [r[0] for r in rows],
            "num_prefill_tokens": [r[1] for r in rows],
            "num_decode_requests": [r[2] for r in rows],
            "num_decode_tokens": [r[2] for r in rows],
            "elapsed_ms": [r[3] for r in rows],
            "kv_cache_usage_pct": np.nan,
        }
    )


def test_steps_are_grouped_by_composition() -> None:
    steps = _steps([(0, 0, 1, 10), (0, 0, 3, 11), (1, 100, 0, 20), (1, 62, 4, 15), (0, 0, 40, 30)])
    assert step_group(steps).tolist() == [
        "decode 1 request",
        "decode 2–4 requests",
        "prefill 65–128 tokens",
        "prefill 65–128 tokens",  # 62 prompt + 4 decode tokens: a mixed step
        "decode 33+ requests",
    ]


def test_a_simulator_with_slow_steps_shows_as_step_time_not_scheduling() -> None:
    real = _steps([(0, 0, 1, 10.0)] * 10 + [(1, 100, 0, 20.0)] * 2)
    sim = _steps([(0, 0, 1, 12.0)] * 10 + [(1, 100, 0, 24.0)] * 2)
    result = compare_steps(real, sim)
    assert result.totals["step_time_error"] == pytest.approx(0.2)
    assert result.totals["step_count_error"] == 0.0
    assert result.totals["busy_time_error"] == pytest.approx(0.2)
    assert result.groups["rel_error"].tolist() == pytest.approx([0.2, 0.2])
    assert any(line.startswith("step time:") and "+20%" in line for line in result.findings)


def test_a_simulator_that_batches_differently_shows_as_scheduling() -> None:
    # same step times per composition, but Vidur runs pairs where the engine ran singles
    real = _steps([(0, 0, 1, 10.0)] * 20)
    sim = _steps([(0, 0, 2, 11.0)] * 10 + [(0, 0, 1, 10.0)] * 2)
    result = compare_steps(
        real, sim, {"real": 0.5, "sim": 2.0}, {"client": 30.0, "server": 24.5, "sim": 20.0}
    )
    assert result.totals["step_time_error"] == pytest.approx(0.0)
    assert result.totals["step_count_error"] == pytest.approx(-0.4)
    assert (
        result.totals["sim"]["batch_size_p50"] == 2 and result.totals["real"]["batch_size_p50"] == 1
    )
    groups = result.groups.set_index("group")
    assert groups.loc["decode 2–4 requests", "real_steps"] == 0
    assert groups["rel_error"].isna().tolist() == [False, True]
    assert any("scheduling: 12 simulated steps vs 20 real (-40%)" in f for f in result.findings)
    assert any("2.00 ms simulated vs 0.50 ms real" in f for f in result.findings)
    assert any(
        "30.0 ms at the client, 24.5 ms on the server's own clock, 20.0 ms simulated; 5.5 ms" in f
        for f in result.findings
    )


def test_a_real_steps_cost_is_its_cadence_when_back_to_back() -> None:
    steps = _steps([(1, 100, 0, 20.0), (0, 0, 1, 10.0), (0, 0, 1, 10.0), (1, 50, 0, 15.0)])
    # read 20 ms apart: the two decodes cost 12 ms each (2 ms of engine loop); the last
    # prefill came after a pause (no decodes running) and gets its own time plus that loop
    steps["time_s"] = [1.000, 1.012, 1.024, 2.000]
    cost, loop = step_cost_ms(steps)
    assert loop == pytest.approx(2.0)
    assert cost.tolist() == pytest.approx([22.0, 12.0, 12.0, 17.0])
    no_times = _steps([(0, 0, 1, 10.0)])
    cost, loop = step_cost_ms(no_times)  # Vidur's batches: their own time
    assert loop == 0.0 and cost.tolist() == [10.0]


def test_queued_time_is_compared_per_request_as_the_engine_stamps_it() -> None:
    from gpu_simulate_test.compare.step_inputs import queued_ms

    real = pd.DataFrame({"request_id": [0, 1, 2], "engine_scheduling_delay_s": [0.001, 0.003, 9]})
    sim = pd.DataFrame({"request_id": [2, 1, 0], "engine_scheduling_delay_s": [9, 0.004, 0.002]})
    # over the joined requests only (2 is left out), matched by id
    queue = queued_ms(real, sim, np.array([0, 1]))
    assert queue is not None
    assert queue["real"] == pytest.approx(2.0) and queue["sim"] == pytest.approx(3.0)
    assert queue["source"] == "per request, as the engine queued it"
    # a run without the column (an older simulation): the server's count instead
    assert queued_ms(real, sim.drop(columns="engine_scheduling_delay_s"), np.array([0])) is None


def test_the_latency_table_sets_the_engine_queued_delay_against_the_real_stamps() -> None:
    from gpu_simulate_test.compare.comparison import sim_scheduling_delay_s

    sim = pd.DataFrame(
        {"scheduling_delay_s": [0.012, 0.0], "engine_scheduling_delay_s": [0.0, 0.0]}
    )
    # a request that waited 12 ms for a running step was queued by vLLM only when it ended
    assert list(sim_scheduling_delay_s(sim)) == [0.0, 0.0]
    older = sim.drop(columns="engine_scheduling_delay_s")
    assert list(sim_scheduling_delay_s(older)) == [0.012, 0.0]


def test_the_front_end_finding_sets_the_same_span_side_by_side() -> None:
    from gpu_simulate_test.compare.steps import ttft_finding

    line = ttft_finding(
        {"client": 30.0, "server": 27.0, "sim": 26.0, "engine": 20.0, "sim_engine": 18.0}
    )
    assert line is not None
    assert "30.0 ms at the client, 20.0 ms on the engine's own clock" in line
    assert "10.0 ms real, 8.0 ms simulated (-20%)" in line
    assert ttft_finding({"client": 30.0, "sim": 26.0}) is None  # neither clock to set it against
