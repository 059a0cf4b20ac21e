"""Multi-turn sessions in a comparison, on hand-made frames: turn buckets (the thin turns merged
into ``≥k``), TTFT by turn and the sessions' durations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.groups import ttft_clocks
from gpu_simulate_test.compare.multi_turn import (
    compare_multi_turn,
    multi_turn_markdown,
    session_durations,
    turn_buckets,
)


@pytest.mark.parametrize(
    ("counts", "min_requests", "order"),
    [
        ([12, 12, 5, 3], 10, ["0", "1", "≥2"]),
        ([12, 12, 12], 10, ["0", "1", "2"]),
        ([3, 2, 1], 10, ["0", "≥1"]),  # turn 0 keeps its own bucket, however thin
        ([12, 12, 12, 4], 10, ["0", "1", "2", "≥3"]),  # one thin turn: still "≥k"
        ([4, 3, 2], 2, ["0", "1", "2"]),
    ],
)
def test_thin_turns_are_merged_into_the_last_bucket(
    counts: list[int], min_requests: int, order: list[str]
) -> None:
    turn = np.repeat(np.arange(len(counts)), counts)
    labels, got = turn_buckets(np.append(turn, -1), min_requests)  # -1: a turn not known
    assert got == order
    assert labels[-1] == ""
    for label in order:
        assert (labels == label).sum() == (
            sum(counts[int(label.lstrip("≥")) :]) if label.startswith("≥") else counts[int(label)]
        )
    assert turn_buckets(np.array([], dtype=np.int64)) == (pytest.approx([]), [])


def _sessions() -> pd.DataFrame:
    """Three sessions: 0 of turns 0-2 (requests 0-2), 1 of turns 0-1 (3-4), 2 of turn 0 (5)."""
    return pd.DataFrame(
        {"request_id": range(6), "session_id": [0, 0, 0, 1, 1, 2], "turn": [0, 1, 2, 0, 1, 0]}
    )


def _side(arrival: list[float], ttft: list[float], e2e: list[float]) -> m.SideTimes:
    n = len(arrival)
    return m.SideTimes(
        arrival_time_s=np.asarray(arrival, dtype=float),
        ttft_s=np.asarray(ttft, dtype=float),
        tpot_s=np.full(n, 0.01),
        e2e_s=np.asarray(e2e, dtype=float),
        scheduling_delay_s=np.full(n, np.nan),
    )


def _joined(request_id: list[int]) -> m.JoinedRequests:
    """Real and simulated sends and times of ``request_id`` (of :func:`_sessions`)."""
    real_arrival = np.array([0.0, 2.0, 5.0, 1.0, 3.0, 4.0])
    sim_arrival = np.array([0.0, 1.5, 4.0, 1.0, 2.5, 4.0])
    ttft = np.array([0.1, 0.2, 0.3, 0.1, 0.2, 0.1])
    e2e = np.array([1.0, 1.0, 1.0, 0.5, 0.5, 0.5])
    ids = np.asarray(request_id)
    return m.JoinedRequests(
        request_id=ids.astype(np.int64),
        num_prefill_tokens=np.full(ids.size, 10, dtype=np.int64),
        num_decode_tokens=np.full(ids.size, 4, dtype=np.int64),
        real=_side(real_arrival[ids], ttft[ids], e2e[ids]),
        sim=_side(sim_arrival[ids], ttft[ids] / 2, e2e[ids] * 0.8),
    )


def test_a_session_lasts_from_its_first_send_to_its_last_token_on_each_side() -> None:
    duration = session_durations(_sessions(), _joined([0, 1, 2, 3, 4, 5]))
    assert duration["sessions"] == 3 and duration["clock"] == "client"
    # real: 5 + 1 - 0 = 6, 3 + 0.5 - 1 = 2.5, 0.5
    # simulated: 4 + 0.8 = 4.8, 2.5 + 0.4 - 1 = 1.9, 0.4
    assert duration["real_p50_s"] == pytest.approx(2.5)
    assert duration["sim_p50_s"] == pytest.approx(1.9)
    assert duration["error_p50"] == pytest.approx(1.9 / 2.5 - 1)
    assert duration["real_p90_s"] == pytest.approx(2.5 + 0.8 * 3.5)
    # a turn not compared (request 4: not ok on a side) leaves its session out
    partial = session_durations(_sessions(), _joined([0, 1, 2, 3, 5]))
    assert partial["sessions"] == 2
    assert partial["real_p50_s"] == pytest.approx((6 + 0.5) / 2)
    none = session_durations(_sessions(), _joined([1, 4]))
    assert none["sessions"] == 0 and np.isnan(none["real_p50_s"])


def test_ttft_by_turn_and_the_section() -> None:
    joined = _joined([0, 1, 2, 3, 4, 5])
    clocks = ttft_clocks(pd.DataFrame({"request_id": range(6)}), None, joined)
    block = compare_multi_turn(_sessions(), joined, clocks, min_requests=2)
    assert block["sessions"] == 3 and block["turn_buckets"] == ["0", "1", "≥2"]
    rows = {r["group"]: r for r in block["ttft_by_turn"]}
    assert [rows[g]["requests"] for g in ("0", "1", "≥2")] == [3, 2, 1]
    assert rows["0"]["real_p50_s"] == pytest.approx(0.1)
    assert rows["1"]["real_p90_s"] == pytest.approx(0.2)
    assert all(r["error_p50"] == pytest.approx(-0.5) for r in block["ttft_by_turn"])
    text = multi_turn_markdown(block, "ttft_by_turn.png", None)
    assert "## Multi-turn sessions" in text and "3 sessions" in text
    assert "| client | ≥2 | 1 | 300.00 | 150.00 | -50.0% |" in text
    assert "![TTFT by turn](ttft_by_turn.png)" in text
    assert "| real | 3 | 2.500 |" in text and "| error |  | -24.0% |" in text
    assert "ttft_by_turn.png" not in multi_turn_markdown(block, None, None)
    assert multi_turn_markdown(None, None, None) == ""
    assert "not looked for: gone" in multi_turn_markdown(None, None, "gone")
