"""Each request's own front end (client − engine TTFT per request) against the two-clocks
table's difference of percentiles: the tail on one clock and on the other are different
requests, and only the per-request reading says what a simulated front end has to match."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.compare import front_end
from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.clocks import clock_rows

N = 10
FRONT_MS = np.array([5.0] * N)
FRONT_MS[3] = 25.0  # one request's way in missed a step: its front end is long
ENGINE_MS = np.array([20.0] * N)
ENGINE_MS[9] = 60.0  # another request's engine part is long


def _side(ttft_ms: np.ndarray) -> m.SideTimes:
    return m.SideTimes(
        arrival_time_s=np.arange(N, dtype=float),
        ttft_s=ttft_ms / 1e3,
        tpot_s=np.full(N, 0.009),
        e2e_s=np.full(N, 0.090),
        scheduling_delay_s=np.full(N, np.nan),
    )


def _real(front_ms: np.ndarray = FRONT_MS) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "request_id": range(N),
            "status": "ok",
            "ttft_s": (ENGINE_MS + front_ms) / 1e3,
            "engine_ttft_s": ENGINE_MS / 1e3,
            "engine_tpot_s": 0.009,
            "engine_e2e_s": 0.085,
        }
    )


def _sim(front_ms: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame(
        {"request_id": range(N), "status": "ok", "frontend_delay_s": front_ms / 1e3}
    )


def _joined(sim_front_ms: np.ndarray) -> m.JoinedRequests:
    return m.JoinedRequests(
        request_id=np.arange(N, dtype=np.int64),
        num_prefill_tokens=np.full(N, 16, dtype=np.int64),
        num_decode_tokens=np.full(N, 8, dtype=np.int64),
        real=_side(ENGINE_MS + FRONT_MS),
        sim=_side(ENGINE_MS + sim_front_ms),
    )


def test_each_request_s_front_end_is_matched_where_the_percentiles_difference_is_not() -> None:
    # the simulation has every request's front end right, on an engine exactly as the real one
    joined = _joined(FRONT_MS)
    record = front_end.front_end_requests(_real(), joined, _sim(FRONT_MS))
    assert record is not None and record["requests"] == N
    assert record["real_ms"]["p50"] == pytest.approx(5.0)
    assert record["real_ms"]["p99"] == pytest.approx(5.0 + 0.91 * 20.0)  # request 3's
    assert record["sim_vs_real"] == pytest.approx({s: 0.0 for s in front_end.STATS})
    # the table's front end at p99 is the client's p99 less the engine's: requests 9 and 3 mixed
    rows = clock_rows(_real(), joined, _sim(FRONT_MS))
    assert rows is not None
    p99 = next(r for r in rows if r["metric"] == "ttft" and r["stat"] == "p99")
    client = np.percentile(ENGINE_MS + FRONT_MS, 99)
    assert 1e3 * p99["front_end_s"] == pytest.approx(client - np.percentile(ENGINE_MS, 99))
    assert 1e3 * p99["front_end_s"] < 0.5 * record["real_ms"]["p99"]


def test_a_short_tail_and_the_truth_s_repeat_are_read_per_request() -> None:
    short = FRONT_MS.copy()
    short[3] = 10.0  # the simulation's way in never misses the step
    again = FRONT_MS * 1.1
    record = front_end.front_end_requests(_real(), _joined(short), _sim(short), _real(again))
    assert record is not None
    assert record["sim_vs_real"]["p50"] == pytest.approx(0.0)
    assert record["sim_vs_real"]["p99"] == pytest.approx((5 + 0.91 * 5) / (5 + 0.91 * 20) - 1)
    assert record["repeat_vs_real"]["p90"] == pytest.approx(0.1)
    text = front_end.markdown(record)
    assert "*Each request's own front end*" in text and f"over the {N} requests" in text
    assert "p99 23.2 ms real / 9.6 simulated (-58.8%; the truth's repeat 25.5, +10.0%)" in text


def test_without_a_simulated_front_end_or_an_engine_clock_there_is_no_record() -> None:
    joined = _joined(FRONT_MS)
    bare = pd.DataFrame({"request_id": range(N), "status": "ok"})
    assert front_end.front_end_requests(_real(), joined, bare) is None
    assert front_end.front_end_requests(_real(), joined, None) is None
    assert (
        front_end.front_end_requests(_real().drop(columns="engine_ttft_s"), joined, _sim(FRONT_MS))
        is None
    )
    assert front_end.markdown(None) == ""


def test_runs_pooled_read_every_request_of_every_run_over_what_both_sides_share() -> None:
    ids = pd.Index(range(N))
    one = {  # a run without a repeat
        "real": pd.Series(FRONT_MS / 1e3, index=ids),
        "sim": pd.Series(FRONT_MS / 1e3, index=ids),
    }
    two = {  # a second run: only its first five requests were simulated, its repeat the same
        "real": pd.Series(np.full(N, 0.008), index=ids),
        "sim": pd.Series(np.full(5, 0.004), index=ids[:5]),
        "repeat": pd.Series(np.full(N, 0.008), index=ids),
    }
    record = front_end.pooled([one, two])
    assert record is not None and record["requests"] == N + 5
    real = np.concatenate([FRONT_MS, np.full(5, 8.0)])
    sim = np.concatenate([FRONT_MS, np.full(5, 4.0)])
    assert record["real_ms"]["mean"] == pytest.approx(real.mean())
    assert record["sim_ms"]["p50"] == pytest.approx(np.percentile(sim, 50))
    # the repeat against the real side over the requests both (and the simulation) have: the
    # second run's five, where it equals the truth, not the first run's, which has none
    assert record["repeat_requests"] == 5 and record["repeat_ms"]["mean"] == pytest.approx(8.0)
    assert record["repeat_vs_real"] == pytest.approx({s: 0.0 for s in front_end.STATS})
    assert front_end.pooled([]) is None
    assert front_end.pooled([{**one, "sim": pd.Series(dtype=float)}]) is None


def test_only_compared_requests_with_a_finite_simulated_front_end_count() -> None:
    sim = _sim(FRONT_MS)
    sim.loc[3, "frontend_delay_s"] = np.nan  # request 3's long front end was not simulated
    joined = _joined(FRONT_MS)
    record = front_end.front_end_requests(_real(), joined, sim)
    assert record is not None and record["requests"] == N - 1
    assert record["real_ms"]["p99"] == pytest.approx(5.0)  # request 3 left out on both sides
    warm = dataclasses.replace(joined, request_id=joined.request_id[4:])  # a warm-up left out
    record = front_end.front_end_requests(_real(), warm, _sim(FRONT_MS))
    assert record is not None and record["requests"] == N - 4
    assert record["sim_vs_real"]["mean"] == pytest.approx(0.0)
    assert record["real_ms"]["p99"] == pytest.approx(5.0)  # request 3 was in the warm-up


def test_a_run_s_tables_give_its_per_request_front_end() -> None:
    real = _real()
    real.loc[2, "status"] = "error"
    got = front_end.real_front_end_s(real)
    assert list(got.index) == [0, 1, 3, 4, 5, 6, 7, 8, 9]
    assert got.loc[3] == pytest.approx(0.025)
    assert front_end.real_front_end_s(real.drop(columns="engine_ttft_s")).empty
    sim = front_end.sim_front_end_s(_sim(FRONT_MS))
    assert sim.loc[3] == pytest.approx(0.025)
    assert front_end.sim_front_end_s(real).empty
