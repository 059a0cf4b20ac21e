"""The whole pipeline through its CLI with tiny settings: every stage lands, knobs match."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_pipeline_end_to_end(tmp_path: Path) -> None:
    proc = run_cli(
        "pipeline",
        "workload.num_requests=12",
        "workload.qps=8",
        "workload.prompt_len.max=64",
        "workload.output_len.max=12",
        "profile.max_num_tokens=128",
        "profile.max_prefill_chunk=128",
        "profile.max_kv_cache_size=128",
        "profile.max_batch_size=16",
        "backend.max_num_seqs=16",
        "backend.max_num_batched_tokens=128",
        "num_warmup_requests=1",
        "engine_overhead=false",  # one vLLM server start, not two (make run calibrates)
        "goodput.ttft=10000",
        "goodput.tpot=1000",
        "output.run_id=e2e",
        cwd=tmp_path,
    )
    root = tmp_path / "tmp"
    for stage in ("workload", "vidur_profile", "vidur_simulate", "real_bench", "compare"):
        meta = json.loads((root / stage / "e2e" / "run_meta.json").read_text())
        assert meta["status"] == "complete", stage
    sim_meta = json.loads((root / "vidur_simulate" / "e2e" / "run_meta.json").read_text())
    real_meta = json.loads((root / "real_bench" / "e2e" / "run_meta.json").read_text())
    assert real_meta["backend"]["name"] == "vllm"  # the default truth
    assert sim_meta["arrivals_from"] == str(Path("tmp") / "real_bench" / "e2e")
    assert sim_meta["scheduler"]["chunk_size"] == 128  # derived from backend.max_num_batched_tokens
    assert sim_meta["scheduler"]["block_size"] == 32  # vLLM's CPU block size
    assert sim_meta["scheduler"]["batch_size_cap"] == 16
    compare_dir = root / "compare" / "e2e"
    data = json.loads((compare_dir / "comparison.json").read_text())
    assert data["num_compared"] == 12
    # goodput as vllm bench serve --goodput: goals this loose are met by every request
    real_summary = json.loads((root / "real_bench" / "e2e" / "summary.json").read_text())
    assert real_summary["goodput"]["good_requests"] == 12
    assert real_summary["request_goodput"] == pytest.approx(real_summary["request_throughput"])
    assert sim_meta["summary"]["goodput"]["good_requests"] == 12
    assert data["goodput"]["goals_ms"] == {"ttft": 10000.0, "tpot": 1000.0}
    assert not any("engine knobs differ" in line for line in data["findings"])
    # a loose bound: Vidur's per-op model alone (engine_overhead=false) leaves out vLLM's engine
    # loop and front end, so on CPU its TTFT came out 15x too fast (2.8 ms against 41.6); within
    # a factor of 50 of the truth, a unit slip (ms for s, x1000) or a lost queue still breaks it
    for metric in ("ttft", "e2e"):
        stats = data["metrics"][metric]
        ratio = stats["sim"]["p50"] / stats["real"]["p50"]
        assert 0.02 < ratio < 50, (metric, stats["real"]["p50"], stats["sim"]["p50"])
    assert (compare_dir / "cdf.png").stat().st_size > 20_000
    # both sides' engine steps line up: vLLM's own step log against Vidur's batches
    assert (compare_dir / "steps.png").stat().st_size > 20_000
    assert (
        data["steps"]["totals"]["real"]["prefill_tokens"]
        == data["steps"]["totals"]["sim"]["prefill_tokens"]
    )
    assert "## Engine steps" in (compare_dir / "summary.md").read_text()
    assert "## Discrepancies" in (compare_dir / "summary.md").read_text()
    # the verdict first: figures judged within the truth's own spread, and the truth's state
    head = (compare_dir / "summary.md").read_text().splitlines()[:10]
    assert any(line.startswith("- **Verdict:** ") for line in head), head
    assert any(line.startswith("- **Truth") for line in head), head
    assert data["verdict"]["judged"] == 12 and data["verdict"]["repeat"]
    # each first token's time split into its hops by the API server's stamps (its spans)
    assert (root / "real_bench" / "e2e" / "front_end_stamps.csv").is_file()
    hops = data["ttft_parts"]
    assert hops["requests"] == 12 and len(hops["hops"]) == 5
    assert sum(h["share_of_mean"] for h in hops["hops"]) == pytest.approx(1.0)
    assert "## Where the first token's time goes" in (compare_dir / "summary.md").read_text()
    # each request's own front end (client − engine TTFT), real, simulated and the repeat
    front = data["front_end_requests"]
    assert front["requests"] == 12 and front["repeat_requests"] == 12
    assert 0 < front["real_ms"]["p50"] <= front["real_ms"]["p99"] and front["repeat_ms"]["p50"] > 0
    for stat in ("p50", "p90", "p99", "mean"):  # no front-end model here (engine_overhead=false)
        ratio = front["sim_ms"][stat] / front["real_ms"][stat]
        assert front["sim_vs_real"][stat] == pytest.approx(ratio - 1)
    assert "*Each request's own front end*" in (compare_dir / "summary.md").read_text()
    # tmp/latest is the newest pipeline's compare, and the last line says where the summary is
    assert (root / "latest").resolve() == compare_dir.resolve()
    assert proc.stdout.strip().splitlines()[-1].startswith("summary: ")
    assert "TTFT" in proc.stdout
    pipeline_meta = json.loads((root / "pipeline" / "e2e" / "run_meta.json").read_text())
    assert set(pipeline_meta["stages"]) >= {"workload", "vidur_simulate", "real_bench", "compare"}
    # the truth twice on one server (pipeline.real_repeat): its run-to-run difference beside
    # the simulator's error on both clocks, and the repeat recorded as its own stage run
    # in the pipeline's own directory: real_bench/ and compare/ hold the main runs only
    repeat = root / "pipeline" / "e2e" / "runs" / "real_bench" / "e2e-r2"
    assert json.loads((repeat / "run_meta.json").read_text())["status"] == "complete"
    assert pipeline_meta["stages"]["real_bench_repeat"]["path"] == str(
        Path("tmp") / "pipeline" / "e2e" / "runs" / "real_bench" / "e2e-r2"
    )
    assert sorted(p.name for p in (root / "real_bench").iterdir()) == ["e2e"]
    assert pipeline_meta["stages"]["real_bench"]["path"] == str(Path("tmp") / "real_bench" / "e2e")
    p50 = [row for row in data["clocks"] if row["stat"] == "p50"]
    assert {row["metric"] for row in p50} == {"ttft", "tpot", "e2e"}
    # two runs of one workload (12 requests) on one server: within 3x of each other. On the
    # shared 2-core host one repeat's p50 once came out 0.43x its first run's (CI, 2026-11-27)
    for row in p50:
        assert -2 / 3 < row["noise_vs_engine"] < 2.0 and -2 / 3 < row["noise_vs_client"] < 2.0
    assert "real vs real (engine)" in (compare_dir / "summary.md").read_text()
    # the simulation again with two other seeds (pipeline.sim_seeds): the range of its error
    # over its own draws on each clock, beside the truth's; recorded in the pipeline's own dir
    for k in (1, 2):
        seeded = root / "pipeline" / "e2e" / "runs" / "vidur_simulate" / f"e2e-seed{k}"
        seed_meta = json.loads((seeded / "run_meta.json").read_text())
        assert seed_meta["status"] == "complete" and seed_meta["config"]["vidur"]["seed"] == 42 + k
        assert pipeline_meta["stages"][f"vidur_simulate_seed{k}"]["path"] == str(
            Path("tmp") / "pipeline" / "e2e" / "runs" / "vidur_simulate" / f"e2e-seed{k}"
        )
    assert sorted(p.name for p in (root / "vidur_simulate").iterdir()) == ["e2e"]
    for row in data["clocks"]:
        low, high = row["seeds_vs_client"]
        assert low <= row["error_vs_client"] <= high and len(row["seeds_sim_s"]) == 2
        assert np.isfinite(row["pooled_vs_client"]) and np.isfinite(row["pooled_vs_engine"])
    assert "over its seeds (client)" in (compare_dir / "summary.md").read_text()
    assert any(line.startswith("- **Over its 3 seeds:** ") for line in head), head
    assert data["verdict"]["pooled"]["judged"] == 12
    # the same arrivals at the real run's own step level (pipeline.at_level), beside the answer:
    # its level recorded, every step's time times it, its errors per figure, never the verdict
    level = pipeline_meta["at_real_step_level"]
    at_dir = root / "pipeline" / "e2e" / "runs" / "vidur_simulate" / "e2e-at-level"
    at_meta = json.loads((at_dir / "run_meta.json").read_text())
    assert at_meta["config"]["vidur"]["step_time_scale"] == pytest.approx(level["ratio"])
    # on the host's CPU the API server shares the engine's cores: its front end scaled too
    assert level["front_end"] is True
    assert at_meta["config"]["vidur"]["frontend_time_scale"] == pytest.approx(level["ratio"])
    # (no engine calibration here: the layer profile alone, the real steps ~16x as long)
    assert 0.2 < level["ratio"] < 100 and level["steps"] >= 20
    assert data["at_real_step_level"]["ratio"] == pytest.approx(level["ratio"])
    assert data["at_real_step_level"]["frontend_time_scale"] == pytest.approx(level["ratio"])
    assert all(np.isfinite(row["at_level_vs_client"]) for row in data["clocks"])
    assert data["verdict"]["at_level"]["judged"] == 12
    assert "## At the real run's step level" in (compare_dir / "summary.md").read_text()
    assert any(line.startswith("- **At the real run's step level** (") for line in head), head
    assert "real vs real" in proc.stdout
    # the shape warm-up ran before the clock: one request per step size, 1 up to the longest
    # prompt + a decode per other request in a batch (16), within the 128-token step budget and
    # the longest request
    requests = pd.read_csv(root / "real_bench" / "e2e" / "request_metrics.csv")
    longest = int(requests["num_prefill_tokens"].max())
    total = int((requests["num_prefill_tokens"] + requests["num_decode_tokens"]).max())
    assert real_meta["num_shape_warmups"] == min(128, longest + 16, total - 1)
    # the host's memory speed around each real run (one LM head, 78 MB, on the engine's core),
    # recorded, not judged; without an engine calibration there is nothing to set it against
    for meta in (real_meta, json.loads((repeat / "run_meta.json").read_text())):
        probe = meta["host_probe"]
        assert probe["before"]["mbytes"] == pytest.approx(151936 * 128 * 4 / 1e6, rel=1e-3)
        assert probe["before"]["ms"] > 0 and probe["after"]["reads"] >= 1
        assert "host_memory" not in meta["disturbance"]["signs"]
    assert data["host_memory"] is None
