"""Where the first token's time goes: the client's, the API server's and the engine's stamps
split each client TTFT into five hops that add up to it; a server's run without the API server's
stamps has no such section (an in-process engine's own stamps: test_ttft_parts_in_process)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.compare.ttft_parts import HOPS, ttft_parts
from gpu_simulate_test.compare.ttft_parts_report import plot_ttft_parts, ttft_parts_markdown
from gpu_simulate_test.core.engines.front_end import front_end_frame
from gpu_simulate_test.core.engines.otlp import RequestSpan
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import write_csv
from gpu_simulate_test.io.schemas import FRONT_END_STAMPS


def _requests(n: int = 20) -> pd.DataFrame:
    sent = np.arange(n) * 0.1
    return pd.DataFrame(
        {
            "request_id": np.arange(n),
            "status": ["ok"] * (n - 1) + ["error"],
            "arrival_time_s": sent,
            "engine_arrival_time_s": sent + 0.004,  # 1 ms to the API server, 3 ms on to the engine
            "engine_first_token_time_s": sent + 0.014 + 0.001 * (np.arange(n) % 5),
            "first_token_time_s": sent + 0.030 + 0.001 * (np.arange(n) % 5),
        }
    )


def _front(n: int = 20) -> pd.DataFrame:
    sent = np.arange(n) * 0.1
    return pd.DataFrame(
        {
            "request_id": np.arange(n),
            "front_arrival_time_s": sent + 0.001,
            "front_first_token_time_s": sent + 0.022 + 0.001 * (np.arange(n) % 5),
        }
    )


def test_the_hops_add_up_to_the_client_ttft(tmp_path: Path) -> None:
    write_csv(tmp_path / layout.FRONT_END_STAMPS, _front(), FRONT_END_STAMPS)
    clocks = [
        {"metric": "ttft", "stat": "p50", "front_end_s": 0.018, "sim_front_end_s": 0.009},
        {"metric": "ttft", "stat": "p90", "front_end_s": 0.020, "sim_front_end_s": 0.011,
         "repeat_client_s": 0.050, "repeat_engine_s": 0.026},
    ]  # fmt: skip
    record = ttft_parts(tmp_path, _requests(), clocks)
    assert record is not None and record["requests"] == 19  # the failed one left out
    assert record["source"] == "api_server"
    hops = {h["hop"]: h for h in record["hops"]}
    assert [h["hop"] for h in record["hops"]] == [name for name, _, _ in HOPS]
    assert hops["client → API server"]["p50"] == pytest.approx(1.0)
    assert hops["API server → engine"]["p50"] == pytest.approx(3.0)
    assert hops["engine (queue + first token)"]["mean"] == pytest.approx(
        10.0 + np.mean(np.arange(19) % 5)
    )
    assert hops["engine → API server"]["p50"] == pytest.approx(8.0)
    assert hops["API server → client"]["p50"] == pytest.approx(8.0)
    per = record["per_request"]
    assert np.allclose(per["total"], 1e3 * (_requests()["first_token_time_s"] - _requests()[
        "arrival_time_s"])[:19])  # fmt: skip
    assert sum(h["share_of_mean"] for h in record["hops"]) == pytest.approx(1.0)
    assert all(h["below_zero"] == 0 for h in record["hops"])
    text = ttft_parts_markdown(record, "ttft_parts.png")
    assert "## Where the first token's time goes (real, ms)" in text
    assert "*Source:* API server hops (`ttft_parts.source`: `api_server`)" in text
    assert "front end is hops 1, 2, 4 and 5 together" in text
    assert record["front_end"]["p90"]["repeat_ms"] == pytest.approx(24.0)  # its own repeat
    assert "repeat_ms" not in record["front_end"]["p50"]  # none recorded
    assert (
        "p50 18.0 real / 9.0 simulated, p90 20.0 real / 11.0 simulated (the truth's "
        "repeat 24.0) ms" in text
    )
    plot_ttft_parts(record, tmp_path / "ttft_parts.png", "test")
    assert (tmp_path / "ttft_parts.png").stat().st_size > 10_000


def test_clocks_that_disagree_show_as_hops_below_zero(tmp_path: Path) -> None:
    front = _front()
    front["front_arrival_time_s"] -= 0.002  # the API server "received" it before it was sent
    write_csv(tmp_path / layout.FRONT_END_STAMPS, front, FRONT_END_STAMPS)
    record = ttft_parts(tmp_path, _requests())
    assert record is not None
    assert {h["hop"]: h["below_zero"] for h in record["hops"]}["client → API server"] == 19


def test_without_the_api_server_s_stamps_there_is_no_section(tmp_path: Path) -> None:
    assert ttft_parts(tmp_path, _requests()) is None
    assert ttft_parts_markdown(None, None) == ""


def test_the_api_server_s_span_lands_on_the_run_clock() -> None:
    span = RequestSpan("cmpl-gstx-3-0", 1000.5, 0.001, 0.008, 0.05, 0.020, 0.071, 8)
    # wall = perf + 900; the run started at perf 100
    frame = front_end_frame({3: span}, 900.0, lambda perf: perf - 100.0)
    assert frame["front_arrival_time_s"].iloc[0] == pytest.approx(0.5)
    assert frame["front_first_token_time_s"].iloc[0] == pytest.approx(0.52)
    assert list(frame.columns) == FRONT_END_STAMPS.column_names


def _sim(n: int = 20, split: bool = True) -> pd.DataFrame:
    """The simulation's request table: 2 ms in, 1 ms held behind a running step, 6 ms back, and a
    TTFT of 17 ms (the engine's part 8 ms), hand-made."""
    frame = pd.DataFrame(
        {"request_id": np.arange(n), "status": ["ok"] * n, "ttft_s": np.full(n, 0.017)}
    )
    if split:
        frame["frontend_input_s"] = 0.002
        frame["held_back_s"] = 0.001
        frame["frontend_first_token_s"] = 0.006
    return frame


def test_the_simulated_parts_stand_beside_the_real_hops_they_add_up(tmp_path: Path) -> None:
    write_csv(tmp_path / layout.FRONT_END_STAMPS, _front(), FRONT_END_STAMPS)
    record = ttft_parts(tmp_path, _requests(), None, _sim())
    assert record is not None
    parts = {p["part"]: p for p in record["simulated"]}
    assert list(parts) == ["send → engine queued", "engine (queue + first token)",
                           "first token → client"]  # fmt: skip
    into, engine, back = parts.values()
    # real: 1 + 3 ms in; the engine 10..14 ms; back 8 + 8 ms (engine → API 8, API → client 8)
    assert (into["real_p50"], into["sim_p50"]) == (pytest.approx(4.0), pytest.approx(3.0))
    assert engine["real_mean"] == pytest.approx(10.0 + np.mean(np.arange(19) % 5))
    assert engine["sim_mean"] == pytest.approx(17.0 - 3.0 - 6.0)
    assert (back["real_p50"], back["sim_p50"]) == (pytest.approx(16.0), pytest.approx(6.0))
    assert into["requests"] == 19  # only the requests both sides have
    text = ttft_parts_markdown(record, None)
    assert "| send → engine queued | 4.00 / 3.00 |" in text
    assert "| first token → client | 16.00 / 6.00 | 16.00 / 6.00 | 16.00 / 6.00 | -10.00 |" in text
    # a simulation without the split (an older run): the real hops alone
    older = ttft_parts(tmp_path, _requests(), None, _sim(split=False))
    assert older is not None and older["simulated"] == []
    assert "Real against simulated" not in ttft_parts_markdown(older, None)
