"""The real bench runs a multi-turn workload's sessions against an OpenAI-compatible stream
server (``tests/fake_openai.py``, in a process of its own), through the vllm backend's real
client, both of them (threads and asyncio): every later turn's prompt is what the server returned
appended, sent its think time after the previous turn's last token; a server that loses an output
id stops that session, with the reason, and sends no wrong-length prompt."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest

from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.core.engines.server import free_loopback_port
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json, read_jsonl
from gpu_simulate_test.io.schemas import REQUEST_METRICS
from gpu_simulate_test.real_bench import stage
from tests.conftest import REPO_ROOT, run_cli
from tests.fake_openai import BLOCK

# sends are held to their closed loop's times within milliseconds: run alone
pytestmark = pytest.mark.timing


@pytest.fixture(scope="module")
def workload_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sessions")
    run_cli(
        "workload",
        "workload=multi_turn",
        "workload.num_requests=4",
        "workload.qps=20",
        "workload.session.turns.kind=fixed",
        "workload.session.turns.value=3",
        "workload.session.think_time.min_s=0.05",
        "workload.session.think_time.max_s=0.15",
        "workload.output_len.min=4",
        "workload.output_len.max=8",
        "workload.session.user_tokens.min=4",
        "workload.session.user_tokens.max=12",
        "output.run_id=w",
        "progress=false",
        cwd=root,
    )
    return root / "tmp" / "workload" / "w"


@contextlib.contextmanager
def _fake_server(tmp_path: Path, *extra: str) -> Iterator[tuple[str, Path]]:
    """The fake server (``extra``: its options) in a process of its own: its base URL and its
    request log."""
    port = free_loopback_port()
    log = tmp_path / "served.jsonl"
    cmd = [sys.executable, "-m", "tests.fake_openai", "--port", str(port), "--log", str(log)]
    proc = subprocess.Popen([*cmd, *extra], cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1).raise_for_status()
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.05)
        yield url, log
    finally:
        proc.terminate()
        proc.wait(10)


Rows = dict[int, dict[Any, Any]]


def _rows(frame: pd.DataFrame) -> Rows:
    """A table's rows by request id."""
    return {int(row["request_id"]): row for row in frame.to_dict("records")}


def _bench(
    compose_stage: Any, tmp_path: Path, workload: Path, url: str, *extra: str
) -> tuple[Rows, dict[str, Any], dict[str, Any]]:
    cfg = compose_stage(
        "real_bench",
        [
            f"workload_dir={workload}",
            "backend=vllm",
            "backend.server.kind=external",
            f"backend.base_url={url}",
            "backend.served_model_name=qwen3_tiny",
            "backend.warmup_shapes=false",
            "backend.host_probe=false",
            "num_warmup_requests=0",
            f"output.root={tmp_path / 'tmp'}",
            "output.run_id=b",
            "progress=false",
            *extra,
        ],
    )
    path = stage.run(to_typed(cfg, RealBenchStageConfig), {"x": 1})
    read_csv(path / layout.REQUEST_METRICS, REQUEST_METRICS)  # the declared table
    frame = pd.read_csv(path / layout.REQUEST_METRICS)  # and its extra columns
    return _rows(frame), read_json(path / layout.RUN_META), read_json(path / stage.SUMMARY)


@pytest.mark.parametrize("client", ["threads", "asyncio"])
def test_each_turn_sends_the_conversation_the_server_returned_on_its_closed_loop_time(
    compose_stage: Any, tmp_path: Path, workload_dir: Path, client: str
) -> None:
    with _fake_server(tmp_path) as (url, log):
        frame, meta, summary = _bench(
            compose_stage, tmp_path, workload_dir, url, f"backend.client={client}"
        )
    lengths = _rows(load_workload(workload_dir).lengths)
    own = {
        int(p["request_id"]): p["prompt_token_ids"]
        for p in read_jsonl(workload_dir / layout.PROMPTS)
    }
    served = {tuple(line["prompt"]): line for line in read_jsonl(log)}
    assert len(frame) == len(lengths) == 12
    assert all(row["status"] == "ok" for row in frame.values())
    assert meta["status"] == "complete" and meta["request_statuses"] == {"ok": 12}
    sessions = meta["sessions"]
    assert sessions["loop"] == "closed" and sessions["num_sessions"] == 4
    assert sessions["num_turns"] == 12 and sessions["turns_per_session"]["max"] == 3
    assert sessions["sessions_completed"] == 4 and sessions["turns_not_sent"] == 0
    assert sessions["later_turns_sent"] == 8
    assert summary["num_not_sent"] == 0 and summary["errors"] == []

    prompt_of: dict[int, tuple[int, ...]] = {}
    for rid, row in lengths.items():
        if row["turn"] == 0:
            prompt_of[rid] = tuple(own[rid])
        else:  # the previous prompt + what the server returned for it + the new message
            before = served[prompt_of[rid - 1]]
            prompt_of[rid] = (*prompt_of[rid - 1], *before["output_ids"], *own[rid])
        assert prompt_of[rid] in served, f"request {rid} sent another prompt"
        planned = row["num_prefill_tokens"]
        assert len(prompt_of[rid]) == planned == frame[rid]["num_prefill_tokens"]
        assert served[prompt_of[rid]]["max_tokens"] == row["num_decode_tokens"]
        if row["turn"] == 0:
            continue
        # the closed loop's time: the previous turn's last token + the think time
        intended = frame[rid - 1]["last_token_time_s"] + row["think_time_s"]
        assert frame[rid]["scheduled_arrival_time_s"] == pytest.approx(intended, abs=1e-9)
        sent = frame[rid]["arrival_time_s"]
        assert 0 <= sent - intended < 0.02, (rid, sent - intended)  # loose: a shared CI box
        # the fake server's prefix cache: the conversation so far hits, block for block
        assert frame[rid]["cached_tokens"] >= len(prompt_of[rid - 1]) // BLOCK * BLOCK


def test_a_lost_output_id_stops_its_session_and_sends_no_wrong_prompt(
    compose_stage: Any, tmp_path: Path, workload_dir: Path
) -> None:
    lengths = _rows(load_workload(workload_dir).lengths)
    short = int(lengths[0]["num_decode_tokens"])  # session 0's turn 0 loses one output id
    with _fake_server(tmp_path, "--short-ids-for", str(short)) as (url, log):
        frame, meta, summary = _bench(compose_stage, tmp_path, workload_dir, url)
    # every answer of that length lost an id: the turns after it are not sent (3 per session)
    hit = [r for r, row in lengths.items() if row["num_decode_tokens"] == short and row["turn"] < 2]
    lost = sorted({r + 1 for r in hit} | {r + 2 for r in hit if lengths[r]["turn"] == 0})
    assert lost and set(lost).isdisjoint(frame)  # never sent: no row
    assert all(row["status"] == "ok" for row in frame.values()) and len(frame) == 12 - len(lost)
    assert meta["request_statuses"] == {"ok": 12 - len(lost), "error": len(lost)}
    sessions = meta["sessions"]
    assert sessions["turns_not_sent"] == len(lost) == summary["num_not_sent"]
    first = sessions["not_sent"][0]
    assert first["request_id"] == lost[0] == 1 and first["turn"] == 1
    expected = f"returned {short - 1} output token ids, not its num_decode_tokens {short}"
    assert first["reason"].startswith("not sent: session 0 turn 0") and expected in first["reason"]
    assert any(e.startswith("not sent") for e in summary["errors"])
    assert len(read_jsonl(log)) == 12 - len(lost)  # nothing else reached the server
