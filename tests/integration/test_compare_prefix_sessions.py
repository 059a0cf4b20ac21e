"""The compare stage on runs with prefix caching and multi-turn sessions: a real multi-turn
workload, the vLLM-V1 loop simulating it with its prefix cache on and off, and a real run made
by hand from the simulation (its times scaled, a few requests' cached tokens changed, an engine
clock): the prefix cache and the turns compared in ``comparison.json`` and ``summary.md``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json, write_csv
from gpu_simulate_test.io.runs import start_run
from gpu_simulate_test.io.schemas import REQUEST_METRICS
from tests.conftest import run_cli
from tests.vidur_bundle_factory import QWEN3_TINY, write_synthetic_bundle

pytestmark = pytest.mark.integration

WORKLOAD = "tmp/workload/mt"
REAL_SCALE = 1.25
"""The hand-made real run's client times are the simulation's times this many times over."""
ENGINE_SHARE = 0.8
"""Its engine clock's TTFT is this share of its client TTFT."""
CHANGED = 3
"""Hits of the real run's first this-many cache hits are one block (16 tokens) smaller."""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A multi-turn workload (32 sessions, 89 requests, one shared system prefix) simulated by
    the vLLM-V1 loop with its prefix cache on (``sim-on``) and off (``sim-off``)."""
    root = tmp_path_factory.mktemp("compare_prefix")
    run_cli("workload", "workload=multi_turn", "output.run_id=mt", "progress=false", cwd=root)
    write_synthetic_bundle(root / "tmp" / "profiles", QWEN3_TINY, points=12)
    knobs = (
        "vidur.predictor.num_training_job_threads=1", f"workload_dir={WORKLOAD}",
        "vidur.scheduler.name=vllm_v1", "vidur.scheduler.block_size=16",
        "vidur.scheduler.chunk_size=256", "vidur.scheduler.num_blocks=4096", "progress=false",
    )  # fmt: skip
    run_cli("vidur_simulate", *knobs, "vidur.scheduler.enable_prefix_caching=true",
            "output.run_id=sim-on", cwd=root)  # fmt: skip
    run_cli("vidur_simulate", *knobs, "output.run_id=sim-off", cwd=root)
    return root


def make_real_run(root: Path, sim_dir: Path, run_id: str) -> tuple[Path, pd.DataFrame]:
    """A finished vLLM real run of the simulation's workload, with prefix caching on: the
    simulation's requests at the same sends, times ``REAL_SCALE`` slower, an engine clock, and
    the simulation's cached tokens but :data:`CHANGED` hits one block smaller."""
    sim = read_csv(sim_dir / layout.REQUEST_METRICS, REQUEST_METRICS)
    sim_meta = read_json(sim_dir / layout.RUN_META)
    cached = sim["cached_tokens"].to_numpy(dtype=np.int64).copy()
    changed = np.flatnonzero(cached > 0)[:CHANGED]
    cached[changed] -= 16
    frame = sim[["request_id", "arrival_time_s", "num_prefill_tokens", "num_decode_tokens"]].copy()
    for column in ("ttft_s", "tpot_s", "e2e_s"):
        frame[column] = sim[column] * REAL_SCALE
    frame["status"] = "ok"
    frame["engine_ttft_s"] = frame["ttft_s"] * ENGINE_SHARE
    frame["engine_tpot_s"] = frame["tpot_s"]
    frame["engine_e2e_s"] = frame["e2e_s"] - frame["ttft_s"] * (1 - ENGINE_SHARE)
    frame["cached_tokens"] = cached
    frame["engine_cached_tokens"] = cached
    hits, queries = int(cached.sum()), int(frame["num_prefill_tokens"].sum())
    config: dict[str, Any] = {
        "model": {"name": "qwen3_tiny"},
        "hardware": {"name": "cpu"},
        "backend": {"name": "vllm", "enable_prefix_caching": True},
        "workload_dir": WORKLOAD,
    }
    with start_run(root / "tmp", "real_bench", run_id, config) as r:
        r.update_meta(
            workload_id=sim_meta["workload_id"],
            workload_dir=WORKLOAD,
            num_requests=len(frame),
            engine_log={
                "prefix_cache_hit_tokens": hits,
                "prefix_cache_query_tokens": queries,
                "prefix_cache_hit_rate": hits / queries,
            },
        )
        write_csv(r.file(layout.REQUEST_METRICS), frame, REQUEST_METRICS)
    return r.path, frame.assign(changed=np.isin(np.arange(len(frame)), changed))


def test_prefix_cache_and_turns_are_compared(project: Path) -> None:
    sim_dir = project / "tmp" / "vidur_simulate" / "sim-on"
    # the front end's way in, over the turns with a scheduled send (none here: no calibration)
    assert read_json(sim_dir / layout.RUN_META)["mean_frontend_input_ms"] == 0.0
    real_dir, real = make_real_run(project, sim_dir, "real")
    proc = run_cli("compare", f"real_run_dir={real_dir}", f"sim_run_dir={sim_dir}",
                   "output.run_id=c", cwd=project)  # fmt: skip
    out = project / "tmp" / "compare" / "c"
    data = json.loads((out / "comparison.json").read_text())
    block = data["prefix_cache"]
    assert block["only"] is None and block["real_source"] == "cached_tokens"

    agree = block["per_request"]
    n = len(real)
    assert agree["requests"] == n and agree["differing"] == CHANGED
    assert agree["identical_fraction"] == pytest.approx((n - CHANGED) / n)
    assert agree["max_abs_diff_tokens"] == 16
    assert agree["mean_abs_diff_tokens"] == pytest.approx(16 * CHANGED / n)
    changed_ids = real.loc[real["changed"], "request_id"].tolist()
    assert [d["request_id"] for d in agree["first_differing"]] == changed_ids
    assert all(d["sim"] - d["real"] == 16 for d in agree["first_differing"])

    # the hit rate: the simulation's recorded totals against the real engine's counters
    sim_totals = read_json(sim_dir / layout.RUN_META)["prefix_cache"]
    queries = int(real["num_prefill_tokens"].sum())
    real_rate = int(real["cached_tokens"].sum()) / queries
    run_rate = block["run_hit_rate"]
    assert run_rate["sim"] == pytest.approx(sim_totals["hit_rate"])
    assert run_rate["real"] == pytest.approx(real_rate)
    assert run_rate["difference_points"] == pytest.approx(16 * CHANGED / queries * 100)
    assert block["compared_hit_rate"]["real"] == pytest.approx(real_rate)

    # hits and misses on both clocks: every simulated client TTFT is the real one / 1.25
    rows = {(r["clock"], r["group"]): r for r in block["ttft_by_hit"]}
    assert set(rows) == {(c, g) for c in ("engine", "client") for g in ("hit", "miss")}
    hits = int((real["cached_tokens"] > 0).sum())
    assert rows["client", "hit"]["requests"] == hits
    assert rows["client", "miss"]["requests"] == n - hits
    for group in ("hit", "miss"):
        client = rows["client", group]
        assert client["error_p50"] == pytest.approx(1 / REAL_SCALE - 1)
        assert client["error_p90"] == pytest.approx(1 / REAL_SCALE - 1)
        engine = rows["engine", group]  # the simulation adds no front end here
        assert engine["error_p50"] == pytest.approx(1 / (REAL_SCALE * ENGINE_SHARE) - 1)

    # the turns: 32 sessions, turn buckets with >= 10 requests each but the last
    turns = data["multi_turn"]
    assert turns["sessions"] == 32
    client_turns = [r for r in turns["ttft_by_turn"] if r["clock"] == "client"]
    assert [r["group"] for r in client_turns] == turns["turn_buckets"]
    assert turns["turn_buckets"][:2] == ["0", "1"]
    assert sum(r["requests"] for r in client_turns) == n
    assert all(r["requests"] >= 10 for r in client_turns[:-1])
    assert all(r["error_p50"] == pytest.approx(1 / REAL_SCALE - 1) for r in client_turns)
    duration = turns["session_duration"]
    assert duration["sessions"] == 32 and duration["clock"] == "client"
    assert duration["real_p50_s"] > duration["sim_p50_s"] > 0  # the same sends, longer turns

    summary = (out / "summary.md").read_text()
    assert "## Prefix cache" in summary and "## Multi-turn sessions" in summary
    assert f"first differing (real vs simulated): {changed_ids[0]} (" in summary
    assert "| client | hit | " in summary and "| engine | miss | " in summary
    assert "![TTFT by turn](ttft_by_turn.png)" in summary
    assert "prefix-cache hit rate (tokens) is" in summary  # under Discrepancies
    assert (out / "ttft_by_turn.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "prefix cache: hit rate real" in proc.stdout


def test_cached_tokens_on_one_side_only_are_named(project: Path) -> None:
    """The real engine cached, the simulation did not: the knob mismatch, the section's note,
    and nothing compared per request."""
    sim_dir = project / "tmp" / "vidur_simulate" / "sim-off"
    real_dir, _ = make_real_run(project, project / "tmp" / "vidur_simulate" / "sim-on", "real1")
    run_cli("compare", f"real_run_dir={real_dir}", f"sim_run_dir={sim_dir}",
            "output.run_id=c1", "compare.plots=false", cwd=project)  # fmt: skip
    out = project / "tmp" / "compare" / "c1"
    block = json.loads((out / "comparison.json").read_text())["prefix_cache"]
    assert block["only"] == "real" and "per_request" not in block
    assert block["run_hit_rate"]["sim"] is None and block["run_hit_rate"]["real"] > 0
    summary = (out / "summary.md").read_text()
    assert "engine knobs differ: prefix caching (real on, simulated off)" in summary
    assert "Only the real run has per-request cached tokens" in summary
    assert "## Multi-turn sessions" in summary and "ttft_by_turn.png" not in summary
    assert not (out / "ttft_by_turn.png").exists()


def test_a_workload_run_that_is_gone_is_said(project: Path, tmp_path: Path) -> None:
    """Compared from another directory, the workload both runs name (relative) is not there:
    the comparison goes on, and says why there is no multi-turn view."""
    sim_dir = project / "tmp" / "vidur_simulate" / "sim-on"
    real_dir, _ = make_real_run(project, sim_dir, "real2")
    run_cli("compare", f"real_run_dir={real_dir}", f"sim_run_dir={sim_dir}",
            "output.run_id=c2", "compare.plots=false", cwd=tmp_path)  # fmt: skip
    out = tmp_path / "tmp" / "compare" / "c2"
    data = json.loads((out / "comparison.json").read_text())
    assert "is not there" in data["multi_turn"]["skipped"]
    assert data["prefix_cache"]["only"] is None
    summary = (out / "summary.md").read_text()
    assert f"*Multi-turn sessions*: not looked for: the workload run `{WORKLOAD}`" in summary


@pytest.fixture(scope="module")
def dense(project: Path) -> Path:
    """The vLLM-V1 loop on 64 requests, one every ms (Poisson): the engine stays busy decoding,
    so most requests arrive while a step runs."""
    run_cli("workload", "workload.qps=1000", "workload.num_requests=64",
            "output.run_id=dense", "progress=false", cwd=project)  # fmt: skip
    run_cli("vidur_simulate", "vidur.predictor.num_training_job_threads=1",
            "workload_dir=tmp/workload/dense", "vidur.scheduler.name=vllm_v1",
            "vidur.scheduler.num_blocks=4096", "output.run_id=dense", "progress=false",
            cwd=project)  # fmt: skip
    return project / "tmp" / "vidur_simulate" / "dense"


def test_a_request_arriving_during_a_step_is_queued_at_its_end(dense: Path) -> None:
    from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE

    sim = read_csv(dense / layout.REQUEST_METRICS, REQUEST_METRICS)
    steps = read_csv(dense / layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE)
    delay = sim["scheduling_delay_s"].to_numpy(dtype=float)
    engine = sim["engine_scheduling_delay_s"].to_numpy(dtype=float)
    # no front end here: each request reaches the scheduler when it is sent
    arrival = sim["arrival_time_s"].to_numpy(dtype=float)
    starts, ends = steps["start_time_s"].to_numpy(), steps["end_time_s"].to_numpy()
    k = np.searchsorted(starts, arrival, side="right") - 1
    during = (k >= 0) & (arrival > starts[np.maximum(k, 0)]) & (arrival < ends[np.maximum(k, 0)])
    assert during.sum() >= 32 and not during[0]  # the first finds the engine idle
    # vLLM reads its input queue between steps: the rest of the running step is not queueing
    assert np.all(engine[during] < delay[during])
    assert np.all(engine[during] <= delay[during] - (ends[k[during]] - arrival[during]) + 1e-9)
    np.testing.assert_allclose(engine[~during], delay[~during], atol=1e-12)
