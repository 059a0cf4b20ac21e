"""Where the first token's time goes on an in-process engine (``hf_cb``): no API server, so no
``front_end_stamps.csv``; the request table's own stamps (the client's send and receipt, the
engine's queueing and first token) split each client TTFT into three hops that add up to it. A
run with neither these stamps nor the API server's has no such section."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.compare.ttft_parts import (
    API_SERVER,
    IN_PROCESS,
    PARTS,
    behind_api_server,
    ttft_parts,
)
from gpu_simulate_test.compare.ttft_parts_report import plot_ttft_parts, ttft_parts_markdown
from gpu_simulate_test.core.engines import BACKENDS
from gpu_simulate_test.core.engines.records import STATUS_ERROR, STATUS_OK, BenchRequest, Recorder
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, write_csv
from gpu_simulate_test.io.schemas import FRONT_END_STAMPS, REQUEST_METRICS
from gpu_simulate_test.real_bench.metrics import request_frame

N = 12
ORIGIN = 100.0
"""``perf_counter()`` at the run's time 0."""
TOKENS = 3


def _engine_first_token_ms(i: int) -> float:
    """Request i's first token, ms after its send, on the engine's stamps: 12..14 ms."""
    return 12.0 + i % 3


def _hf_cb_run(run_dir: Path, engine_stamps: bool = True) -> pd.DataFrame:
    """A real request table as an hf_cb run writes it and compare reads it: the recorder fed as
    hf_cb's ``submit`` and collector feed it (the send; the engine's ``created_time`` 0.05 ms
    later, ``lifespan[0]`` and per-token stamps; each token seen 0.4 ms after the engine's
    stamp), written by the real bench's request table, read back from its CSV. The last
    request fails without a token. ``engine_stamps`` false: an engine that stamps nothing (as
    ``hf_generate``)."""
    requests = [BenchRequest(i, 16, TOKENS, 0.1 * i) for i in range(N)]
    recorder = Recorder(requests, origin=ORIGIN)
    for i in range(N):
        sent = ORIGIN + 0.1 * i
        recorder.arrived(i, sent)
        if i == N - 1:
            recorder.finish(i, STATUS_ERROR, "the engine failed it")
            continue
        stamps = [sent + 1e-3 * _engine_first_token_ms(i) + 0.005 * k for k in range(TOKENS)]
        if engine_stamps:
            recorder.engine_times(i, arrival=sent + 5e-5, scheduled=sent + 1e-3, token_times=stamps)
        for stamp in stamps:
            recorder.tokens(i, stamp + 4e-4, 1)
        recorder.finish(i, STATUS_OK)
    write_csv(run_dir / layout.REQUEST_METRICS, request_frame(recorder.snapshot()), REQUEST_METRICS)
    return read_csv(run_dir / layout.REQUEST_METRICS, REQUEST_METRICS)


def _sim() -> pd.DataFrame:
    """The simulation's split: 2 ms in, 1 ms held back, 6 ms back, a TTFT of 17 ms."""
    return pd.DataFrame(
        {
            "request_id": np.arange(N),
            "status": "ok",
            "ttft_s": 0.017,
            "frontend_input_s": 0.002,
            "held_back_s": 0.001,
            "frontend_first_token_s": 0.006,
        }
    )


def test_an_in_process_engine_s_own_stamps_split_its_first_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    requests = _hf_cb_run(tmp_path)
    assert not (tmp_path / layout.FRONT_END_STAMPS).exists()
    clocks = [{"metric": "ttft", "stat": "p50", "front_end_s": 0.00045, "sim_front_end_s": 0.009}]
    record = ttft_parts(tmp_path, requests, clocks, api_server=False)
    assert record is not None and record["source"] == "in_process"
    assert record["requests"] == N - 1  # the failed one left out
    hops = {h["hop"]: h for h in record["hops"]}
    assert list(hops) == ["client → engine queued", "engine (queue + first token)",
                          "engine → client"]  # fmt: skip
    assert [(h["from"], h["to"]) for h in record["hops"]] == [
        ("arrival_time_s", "engine_arrival_time_s"),
        ("engine_arrival_time_s", "engine_first_token_time_s"),
        ("engine_first_token_time_s", "first_token_time_s"),
    ]
    into, engine, back = hops.values()
    assert (into["p50"], into["p99"]) == (pytest.approx(0.05), pytest.approx(0.05))
    engine_ms = [_engine_first_token_ms(i) - 0.05 for i in range(N - 1)]
    assert engine["mean"] == pytest.approx(np.mean(engine_ms))
    assert engine["p50"] == pytest.approx(np.median(engine_ms))
    assert (back["p50"], back["mean"]) == (pytest.approx(0.4), pytest.approx(0.4))
    assert all(h["below_zero"] == 0 for h in record["hops"])
    # the hops add up to each request's client TTFT, as the request table has it
    per = record["per_request"]
    client_ttft_ms = 1e3 * requests.set_index("request_id").loc[per["request_id"], "ttft_s"]
    assert np.allclose(per[list(hops)].sum(axis=1), client_ttft_ms.to_numpy())
    assert np.allclose(per["total"], client_ttft_ms.to_numpy())
    assert sum(h["share_of_mean"] for h in record["hops"]) == pytest.approx(1.0)
    text = ttft_parts_markdown(record, "ttft_parts.png")
    assert "*Source:* an in-process engine's own stamps (`ttft_parts.source`: `in_process`)" in text
    assert "no API server between them" in text and "→ API server" not in text
    assert "split into its hops by the request table's own stamps (the client's send" in text
    assert "| engine → client | 0.40 | 0.40 | 0.40 | 0.40 | 3% | 0 |" in text
    assert "front end is hops 1 and 3 together (client − engine TTFT): p50 0.5 real" in text
    assert "![where the first token's time goes (an in-process engine's own stamps)]" in text
    import matplotlib.pyplot as plt

    closed: list[plt.Figure] = []
    close = plt.close

    def keep(fig: plt.Figure) -> None:
        closed.append(fig)
        close(fig)

    monkeypatch.setattr(plt, "close", keep)
    plot_ttft_parts(record, tmp_path / "ttft_parts.png", "hf_cb")
    assert (tmp_path / "ttft_parts.png").stat().st_size > 10_000
    axes = closed[0].axes[0]
    assert axes.get_title() == "hf_cb\n(an in-process engine's own stamps)"
    legend = axes.get_legend()
    assert legend is not None
    assert [t.get_text() for t in legend.get_texts()] == [*hops, "client TTFT"]


def test_the_simulated_parts_stand_beside_the_in_process_hops(tmp_path: Path) -> None:
    record = ttft_parts(tmp_path, _hf_cb_run(tmp_path), None, _sim(), api_server=False)
    assert record is not None
    parts = {p["part"]: p for p in record["simulated"]}
    assert tuple(parts) == PARTS
    into, engine, back = parts.values()
    assert (into["real_p50"], into["sim_p50"]) == (pytest.approx(0.05), pytest.approx(3.0))
    assert engine["real_mean"] == pytest.approx(np.mean([12.0 + i % 3 for i in range(11)]) - 0.05)
    assert engine["sim_mean"] == pytest.approx(17.0 - 3.0 - 6.0)
    assert (back["real_p90"], back["sim_p90"]) == (pytest.approx(0.4), pytest.approx(6.0))
    assert into["requests"] == N - 1
    text = ttft_parts_markdown(record, None)
    assert "| send → engine queued | 0.05 / 3.00 | 0.05 / 3.00 | 0.05 / 3.00 | +2.95 |" in text
    said = "(the real hop 1), the engine's own part (hop 2), and its way back (hop 3); the "
    assert said + "simulation puts the wait for the step running at the send in the way in" in text


def test_a_run_with_neither_stamp_set_has_no_section(tmp_path: Path) -> None:
    unstamped = _hf_cb_run(tmp_path, engine_stamps=False)  # an engine that stamps nothing
    assert unstamped["engine_arrival_time_s"].isna().all()
    assert ttft_parts(tmp_path, unstamped, api_server=False) is None
    older = _hf_cb_run(tmp_path).drop(columns=["engine_arrival_time_s"])  # an older table
    assert ttft_parts(tmp_path, older, api_server=False) is None
    # a server's engine stamps straddle its API server: without its span, no section
    assert ttft_parts(tmp_path, _hf_cb_run(tmp_path), api_server=True) is None
    assert ttft_parts_markdown(None, None) == ""


def test_the_api_server_s_stamps_come_first_where_a_run_has_them(tmp_path: Path) -> None:
    requests = _hf_cb_run(tmp_path)
    sent = requests["arrival_time_s"].to_numpy()
    front = pd.DataFrame(
        {
            "request_id": requests["request_id"],
            "front_arrival_time_s": sent + 2e-5,
            "front_first_token_time_s": requests["first_token_time_s"].astype(float) - 1e-4,
        }
    ).dropna()
    write_csv(tmp_path / layout.FRONT_END_STAMPS, front, FRONT_END_STAMPS)
    record = ttft_parts(tmp_path, requests, api_server=False)
    assert record is not None and record["source"] == API_SERVER.name
    assert [h["hop"] for h in record["hops"]] == [name for name, _, _ in API_SERVER.hops]
    assert "*Source:* API server hops (`ttft_parts.source`: `api_server`)" in (
        ttft_parts_markdown(record, None)
    )


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_only_a_backend_behind_an_api_server_keeps_to_its_stamps(name: str) -> None:
    expected = name in ("openai", "vllm")  # HTTP to a server; the rest in the client's process
    assert behind_api_server({"config": {"backend": {"name": name}}}) is expected
    assert BACKENDS[name].api_server is expected


def test_an_unknown_backend_counts_as_behind_an_api_server() -> None:
    assert behind_api_server({"config": {"backend": {"name": "tgi"}}})
    assert behind_api_server({})
    assert {IN_PROCESS.name, API_SERVER.name} == {"in_process", "api_server"}
