"""Each first token by the engine's state at its send (busy, or idle and for how long): read
from a real vLLM run's engine stamps, and from a simulation's own queueing and finishing; the
parts of the first token split by it, real beside simulated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.compare import send_state
from gpu_simulate_test.compare.send_state import STATES, states
from gpu_simulate_test.compare.ttft_parts import ttft_parts
from gpu_simulate_test.compare.ttft_parts_report import ttft_parts_markdown
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import write_csv
from gpu_simulate_test.io.schemas import FRONT_END_STAMPS

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm" / "frontend_queue" / "q20"


def test_a_send_is_busy_while_another_runs_else_idle_by_how_long() -> None:
    # request 0 runs 0.00-0.10; 1 is sent at 0.05 (busy), runs to 0.20; 2 at 0.23 (idle 30 ms),
    # runs to 0.26; 3 at 0.40 (idle 140 ms), runs to 0.45; 4 at 1.0 (idle 550 ms)
    sent = np.array([0.0, 0.05, 0.23, 0.40, 1.0])
    queued = sent + 0.003
    done = np.array([0.10, 0.20, 0.26, 0.45, 1.1])
    got = states(sent, queued, done)
    assert list(got) == [STATES[2], STATES[3], STATES[0], STATES[1], STATES[2]]


def test_the_states_of_a_real_vllm_run_match_their_definition_request_by_request() -> None:
    """On a real vLLM run's engine stamps (20 req/s): busy exactly where another request had
    been queued and had not finished at the send, else the band of the time since the last
    finish; both kinds present (mostly busy at this load)."""
    rows = pd.read_csv(DATA / "request_metrics.csv").assign(status="ok")
    got = send_state.real_states(rows)
    assert got is not None and len(got) == len(rows)
    sent = rows["arrival_time_s"].to_numpy()
    queued = rows["engine_arrival_time_s"].to_numpy()
    done = rows["engine_last_token_time_s"].to_numpy()
    for k, t in enumerate(sent):
        busy = np.any((queued < t) & (done > t))
        before = done[done <= t]
        idle_ms = (t - before.max()) * 1e3 if len(before) else np.inf
        band = 0 if idle_ms < 50 else 1 if idle_ms < 200 else 2
        assert got.iloc[k] == (STATES[3] if busy else STATES[band])
    assert STATES[3] in set(got) and len(set(got)) >= 2
    assert send_state.real_states(rows.drop(columns="engine_last_token_time_s")) is None


def _requests() -> pd.DataFrame:
    """Ten requests 0.1 s apart, each 40 ms on the engine (idle 56 ms before each but the first),
    then two sent into the last one's run (busy)."""
    sent = np.r_[np.arange(10) * 0.1, 0.92, 0.93]
    queued = sent + 0.004
    return pd.DataFrame(
        {
            "request_id": np.arange(12),
            "status": "ok",
            "arrival_time_s": sent,
            "engine_arrival_time_s": queued,
            "engine_first_token_time_s": queued + np.r_[np.full(10, 0.010), 0.020, 0.020],
            "engine_last_token_time_s": queued + 0.040,
            "first_token_time_s": queued + np.r_[np.full(10, 0.012), 0.022, 0.022],
        }
    )


def test_the_parts_split_by_the_state_at_the_send(tmp_path: Path) -> None:
    real = _requests()
    front = pd.DataFrame(
        {
            "request_id": real["request_id"],
            "front_arrival_time_s": real["arrival_time_s"] + 0.001,
            "front_first_token_time_s": real["engine_first_token_time_s"] + 0.001,
        }
    )
    write_csv(tmp_path / layout.FRONT_END_STAMPS, front, FRONT_END_STAMPS)
    # the simulation: 3 ms in, the engine 10 ms (busy: 1 ms held, 15 ms), 1 ms back, 40 ms runs
    busy = np.r_[np.zeros(10, dtype=bool), True, True]
    sim = pd.DataFrame(
        {
            "request_id": np.arange(12),
            "status": "ok",
            "arrival_time_s": real["arrival_time_s"],
            "frontend_input_s": 0.003,
            "held_back_s": np.where(busy, 0.001, 0.0),
            "frontend_first_token_s": 0.001,
            "frontend_last_token_s": 0.001,
            "ttft_s": np.where(busy, 0.003 + 0.001 + 0.015 + 0.001, 0.003 + 0.010 + 0.001),
            "e2e_s": np.where(busy, 0.003 + 0.001, 0.003) + 0.040 + 0.001,
        }
    )
    record = ttft_parts(tmp_path, real, None, sim)
    assert record is not None
    rows = {r["state"]: r for r in record["by_send_state"]}
    assert list(rows) == [STATES[1], STATES[2], STATES[3]]  # 56 ms idle: 50–200
    assert (rows[STATES[1]]["real_requests"], rows[STATES[1]]["sim_requests"]) == (9, 9)
    into, engine = "send → engine queued", "engine (queue + first token)"
    assert rows[STATES[3]][into]["real_mean"] == pytest.approx(4.0)
    assert rows[STATES[3]][into]["sim_mean"] == pytest.approx(4.0)
    assert rows[STATES[3]][engine]["real_mean"] == pytest.approx(20.0)
    assert rows[STATES[3]][engine]["sim_mean"] == pytest.approx(15.0)
    assert rows[STATES[1]][engine]["sim_mean"] == pytest.approx(10.0)
    text = ttft_parts_markdown(record, None)
    assert "| busy | 2 / 2 | 4.00 / 4.00 | 20.00 / 15.00 | 2.00 / 1.00 |" in text
    # without the real engine's last tokens: no split, the rest of the section stays
    older = ttft_parts(tmp_path, real.drop(columns="engine_last_token_time_s"), None, sim)
    assert older is not None and older["by_send_state"] == []
    assert "By the engine's state" not in ttft_parts_markdown(older, None)
