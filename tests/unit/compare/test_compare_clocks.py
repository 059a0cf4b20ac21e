"""The comparison's two clocks: the simulation against the engine's clock and the client's, the
front end between them, and no table where the real run has no engine clock."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.clocks import clock_rows, clocks_markdown


def _side(ttft: float, tpot: float, e2e: float, n: int) -> m.SideTimes:
    return m.SideTimes(
        arrival_time_s=np.arange(n, dtype=float),
        ttft_s=np.full(n, ttft),
        tpot_s=np.full(n, tpot),
        e2e_s=np.full(n, e2e),
        scheduling_delay_s=np.full(n, np.nan),
    )


def _joined(n: int = 4) -> m.JoinedRequests:
    return m.JoinedRequests(
        request_id=np.arange(n, dtype=np.int64),
        num_prefill_tokens=np.full(n, 16, dtype=np.int64),
        num_decode_tokens=np.full(n, 8, dtype=np.int64),
        real=_side(0.030, 0.010, 0.100, n),  # the client's clock
        sim=_side(0.022, 0.009, 0.090, n),
    )


def _engine_clock(request_ids: list[int]) -> pd.DataFrame:
    """A real run's engine clock: TTFT 20 ms, TPOT 9 ms, E2E 85 ms for every request."""
    n = len(request_ids)
    return pd.DataFrame(
        {
            "request_id": request_ids,
            "engine_ttft_s": [0.020] * n,
            "engine_tpot_s": [0.009] * n,
            "engine_e2e_s": [0.085] * n,
        }
    )


def test_the_simulation_is_judged_on_both_clocks_with_the_front_end_between() -> None:
    real = _engine_clock([3, 2, 1, 0])  # any order: joined by id
    rows = clock_rows(real, _joined())
    assert rows is not None
    ttft = next(r for r in rows if r["metric"] == "ttft" and r["stat"] == "p50")
    assert ttft["engine_s"] == pytest.approx(0.020) and ttft["client_s"] == pytest.approx(0.030)
    assert ttft["error_vs_engine"] == pytest.approx(0.022 / 0.020 - 1)
    assert ttft["error_vs_client"] == pytest.approx(0.022 / 0.030 - 1)
    assert ttft["front_end_s"] == pytest.approx(0.010)
    text = clocks_markdown(rows)
    assert "## Two clocks" in text
    assert "| TTFT | p50 | 20.00 | 22.00 | +10.0% | 30.00 | 22.00 | -26.7% | 10.00 |" in text


def test_the_simulated_engine_is_judged_without_the_front_end_it_added() -> None:
    real = _engine_clock([0, 1, 2, 3])
    # the simulation added 4 ms of front end to every TTFT and E2E (0.022 = 0.018 + 0.004)
    sim = pd.DataFrame({"request_id": [3, 2, 1, 0], "frontend_delay_s": [0.004] * 4})
    rows = clock_rows(real, _joined(), sim)
    assert rows is not None
    by = {(r["metric"], r["stat"]): r for r in rows}
    ttft, e2e, tpot = by[("ttft", "p50")], by[("e2e", "p50")], by[("tpot", "p50")]
    assert ttft["sim_engine_s"] == pytest.approx(0.018)
    assert ttft["error_vs_engine"] == pytest.approx(0.018 / 0.020 - 1)  # engine vs engine
    assert ttft["error_vs_client"] == pytest.approx(0.022 / 0.030 - 1)  # client vs client
    assert ttft["sim_front_end_s"] == pytest.approx(0.004)
    assert e2e["sim_engine_s"] == pytest.approx(0.086)
    assert tpot["sim_engine_s"] == pytest.approx(tpot["sim_s"])  # a difference: unchanged


def test_the_simulated_engine_s_e2e_is_less_its_last_token_s_way_back() -> None:
    """The front end as a queue delivers a request's first token 5 ms after the engine made it
    and its last 12 ms after: TTFT's share is 3 ms in + 5 ms back, E2E's 3 + 12."""
    real = _engine_clock([0, 1, 2, 3])
    sim = pd.DataFrame(
        {
            "request_id": [0, 1, 2, 3],
            "frontend_delay_s": [0.008] * 4,
            "frontend_first_token_s": [0.005] * 4,
            "frontend_last_token_s": [0.012] * 4,
        }
    )
    rows = clock_rows(real, _joined(), sim)
    assert rows is not None
    by = {(r["metric"], r["stat"]): r for r in rows}
    assert by[("ttft", "p50")]["sim_engine_s"] == pytest.approx(0.022 - 0.008)
    assert by[("e2e", "p50")]["sim_engine_s"] == pytest.approx(0.090 - 0.015)
    # (E2E − TTFT) on the engine's clock over the 7 later tokens: 7 ms less than the client's
    assert by[("tpot", "p50")]["sim_engine_s"] == pytest.approx(0.009 - 0.007 / 7)


def test_without_an_engine_clock_there_is_no_table() -> None:
    no_columns = pd.DataFrame({"request_id": [0, 1, 2, 3]})
    assert clock_rows(no_columns, _joined()) is None
    empty = pd.DataFrame(
        {"request_id": [0, 1, 2, 3], "engine_ttft_s": [np.nan] * 4,
         "engine_tpot_s": [np.nan] * 4, "engine_e2e_s": [np.nan] * 4}
    )  # fmt: skip
    assert clock_rows(empty, _joined()) is None  # a vllm server run: columns present, empty
    assert clocks_markdown(None) == ""


def test_a_repeated_real_run_gives_the_noise_floor_on_each_clock() -> None:
    real = _engine_clock([0, 1, 2, 3])
    # the repeat: 10% slower on the engine, its client clock 20% over the first run's; request
    # 3 failed there and an extra request 9 is not among the joined ones
    repeat = pd.DataFrame(
        {
            "request_id": [0, 1, 2, 3, 9],
            "status": ["ok", "ok", "ok", "error", "ok"],
            "engine_ttft_s": [0.022, 0.022, 0.022, 9.0, 9.0],
            "engine_tpot_s": [0.0099] * 5,
            "engine_e2e_s": [0.0935] * 5,
            "ttft_s": [0.036, 0.036, 0.036, 9.0, 9.0],
            "tpot_s": [0.012] * 5,
            "e2e_s": [0.120] * 5,
        }
    )
    rows = clock_rows(real, _joined(), repeat=repeat)
    assert rows is not None
    ttft = next(r for r in rows if r["metric"] == "ttft" and r["stat"] == "p99")
    assert ttft["repeat_engine_s"] == pytest.approx(0.022)  # the failed request left out
    assert ttft["noise_vs_engine"] == pytest.approx(0.1)
    assert ttft["noise_vs_client"] == pytest.approx(0.2)
    e2e = next(r for r in rows if r["metric"] == "e2e" and r["stat"] == "p50")
    assert e2e["noise_vs_engine"] == pytest.approx(0.1)
    assert e2e["noise_vs_client"] == pytest.approx(0.2)
    text = clocks_markdown(rows)
    assert "real vs real (engine)" in text and "*Real vs real*" in text
    row = "| TTFT | p50 | 20.00 | 22.00 | +10.0% | +10.0% | 30.00 | 22.00 | -26.7% | +20.0% |"
    assert row in text
    # without a repeat: no such column
    assert "real vs real" not in clocks_markdown(clock_rows(real, _joined()) or [])


def test_the_front_end_means_are_client_less_engine_on_both_sides() -> None:
    from gpu_simulate_test.compare.step_inputs import engine_ttft_ms

    real = _engine_clock([3, 2, 1, 0])
    sim = pd.DataFrame(
        {"request_id": [0, 1, 2, 3], "frontend_delay_s": [0.004, 0.006, 0.008, 0.010]}
    )
    means = engine_ttft_ms(real, sim, _joined())
    # the real engine's 20 ms; the simulation's 22 ms client TTFT less the 7 ms it added
    assert means == pytest.approx({"engine": 20.0, "sim_engine": 15.0})
    assert engine_ttft_ms(real.drop(columns="engine_ttft_s"), sim, _joined()) == {}
