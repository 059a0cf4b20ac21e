"""Where the first token's time goes: the client's, the API server's and the engine's stamps
split each client TTFT into five hops that add up to it; a run without the API server's stamps
has no such section."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.compare.ttft_parts import (
    HOPS,
    plot_ttft_parts,
    ttft_parts,
    ttft_parts_markdown,
)
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
    clocks = [{"metric": "ttft", "stat": "p50", "front_end_s": 0.018, "sim_front_end_s": 0.009}]
    record = ttft_parts(tmp_path, _requests(), clocks)
    assert record is not None and record["requests"] == 19  # the failed one left out
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
    assert "p50 18.0 real / 9.0 simulated ms" in text
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
