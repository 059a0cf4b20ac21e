"""Oracle replay end to end, as a user runs it: ``vidur_simulate step_times_from=<real run>``
on a real vLLM run that preempted (its scheduler's own record, in the test data), then
``compare``: every step the same, the same preemptions, the engine's own latencies."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE
from tests.conftest import run_cli
from tests.vidur_bundle_factory import QWEN3_TINY, SyntheticRanges, write_synthetic_bundle

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm" / "step_record"
V1 = (
    "vidur.scheduler.name=vllm_v1",
    "vidur.scheduler.chunk_size=128",
    "vidur.scheduler.batch_size_cap=32",
    "vidur.scheduler.block_size=32",
    "vidur.scheduler.num_blocks=16",
    "vidur.predictor.num_training_job_threads=1",
)
RUN_KNOBS = {"name": "vllm_v1", "chunk_size": 128, "batch_size_cap": 32, "block_size": 32,
             "num_blocks": 16}  # fmt: skip
"""What the test data's run_meta.json records of its server (config.backend)."""


def oracle_project(root: Path, data: Path, run_id: str) -> Path:
    """A project under ``root`` holding the real run of the test data ``data`` as
    ``tmp/real_bench/<run_id>``, its workload as ``tmp/workload/w`` and a synthetic bundle."""
    shutil.copytree(data / "workload", root / "tmp" / "workload" / "w")
    shutil.copytree(
        data, root / "tmp" / "real_bench" / run_id, ignore=shutil.ignore_patterns("workload")
    )
    ranges = SyntheticRanges(max_num_tokens=4096, max_kv_cache_size=4096, block_size=32)
    write_synthetic_bundle(root / "tmp" / "profiles", QWEN3_TINY, ranges=ranges, points=8)
    return root


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return oracle_project(tmp_path_factory.mktemp("oracle"), DATA, "v")


def test_an_oracle_replay_of_a_preempting_vllm_run_takes_every_step_vllm_took(
    project: Path,
) -> None:
    # the scheduler and its knobs are the run's (its run_meta.json): none repeated here
    run_cli(
        "vidur_simulate",
        "workload_dir=tmp/workload/w",
        "step_times_from=tmp/real_bench/v",
        "output.run_id=oracle",
        "vidur.predictor.num_training_job_threads=1",
        cwd=project,
    )
    sim = project / "tmp" / "vidur_simulate" / "oracle"
    meta = read_json(sim / layout.RUN_META)
    assert {k: meta["scheduler"][k] for k in RUN_KNOBS} == RUN_KNOBS
    # the recorded config is what ran: the run's knobs, not the schema's defaults
    assert meta["config"]["vidur"]["scheduler"] == meta["scheduler"]
    assert meta["preemptions"] == 10 and meta["oracle"]["exact"]
    assert meta["oracle"]["step_times"] == {"same position": 661}
    schedule = read_csv(sim / layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE)
    real = read_csv(project / "tmp" / "real_bench" / "v" / layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE)
    assert (schedule["requests"] == real["requests"]).all()

    proc = run_cli(
        "compare",
        "real_run_dir=tmp/real_bench/v",
        "sim_run_dir=tmp/vidur_simulate/oracle",
        "output.run_id=c",
        cwd=project,
    )
    assert "100.0% of steps the same" in proc.stdout
    out = project / "tmp" / "compare" / "c"
    data = read_json(out / "comparison.json")
    assert data["steps"]["same_composition_fraction"] == 1.0
    assert data["steps"]["alignment"]["preemptions"] == {"real": 10, "sim": 10}
    assert data["steps"]["alignment"]["first_divergence"] is None
    engine = {(row["metric"], row["stat"]): row["error_vs_engine"] for row in data["clocks"]}
    for metric in ("ttft", "tpot", "e2e"):
        for stat in ("p50", "p90"):
            assert abs(engine[metric, stat]) < 1e-6, (metric, stat, engine[metric, stat])
    assert (out / "step_by_step.png").stat().st_size > 10_000
    assert "Step by step" in (out / "summary.md").read_text()


def test_an_oracle_replay_refuses_a_knob_that_contradicts_the_run(project: Path) -> None:
    proc = run_cli(
        "vidur_simulate",
        "workload_dir=tmp/workload/w",
        "step_times_from=tmp/real_bench/v",
        "vidur.scheduler.chunk_size=256",
        cwd=project,
        check=False,
    )
    assert proc.returncode == 2
    assert (
        "vidur.scheduler.chunk_size=256 contradicts the run step_times_from=tmp/real_bench/v, "
        "whose backend.max_num_batched_tokens gives chunk_size=128"
    ) in proc.stdout


def test_serving_terms_fitted_on_a_bundle_s_replays_reach_the_simulation(project: Path) -> None:
    """A bundle whose vllm calibration carries replays under load (here the real step record
    kept in the test data, as ``serving_steps.csv``): the predictor-timed vllm_v1 simulation
    fits the serving terms on them, says which runs calibrated them, plots the residuals, and
    its steps differ from the same simulation without them (``vidur.serving_load=false``)."""
    from gpu_simulate_test.core.profiling.bundle import ENGINE_STEPS_TABLE, SERVING_STEPS_TABLE
    from gpu_simulate_test.io.artifacts import write_csv, write_json
    from tests.unit.calibration.test_engine_overhead import steps

    bundle = project / "tmp" / "profiles" / "cpu" / "qwen3_tiny"
    write_csv(bundle / layout.ENGINE_STEPS, steps("vllm"), ENGINE_STEPS_TABLE)
    record = read_csv(DATA / layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE)
    record.insert(0, "replay", 0)
    record.insert(0, "rate_qps", 20.0)
    record.insert(0, "backend", "vllm")
    write_csv(bundle / layout.SERVING_STEPS, record, SERVING_STEPS_TABLE)
    meta = read_json(bundle / layout.BUNDLE_META)
    serving = {"seed": 104729, "rates_qps": [20.0], "requests": [64]}
    write_json(
        bundle / layout.BUNDLE_META, {**meta, "engine_calibration": {"vllm": {"serving": serving}}}
    )

    def simulate(run_id: str, *extra: str) -> Path:
        run_cli(
            "vidur_simulate",
            "workload_dir=tmp/workload/w",
            f"output.run_id={run_id}",
            "vidur.engine_overhead=vllm",
            "vidur.frontend_latency=false",
            *V1,
            *extra,
            cwd=project,
        )
        return project / "tmp" / "vidur_simulate" / run_id

    with_terms, without = simulate("serving"), simulate("plain", "vidur.serving_load=false")
    report = read_json(with_terms / layout.RUN_META)["serving_load"]
    assert read_json(without / layout.RUN_META)["serving_load"] is None
    assert report["calibrated_on"]["seed"] == 104729
    assert report["calibrated_on"]["bundle"].endswith(layout.SERVING_STEPS)
    assert report["steps"] + report["steps_without_prediction"] == 661
    assert report["terms"]["noise_sigma"] > 0
    totals = report["total_time_ratio"]
    assert abs(totals["with_serving_terms"] - 1) < abs(totals["composition_only"] - 1)
    assert {r["candidate"] for r in report["residuals"]} >= {"arrival_rate", "stream_rate"}
    assert (with_terms / layout.STEP_RESIDUALS_PLOT).stat().st_size > 10_000
    assert (with_terms / "serving_residuals.csv").is_file()
    a = read_csv(with_terms / layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE)
    b = read_csv(without / layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE)
    assert not np.allclose(a["end_time_s"].iloc[:20], b["end_time_s"].iloc[:20])
    # vidur.wake_spread: this record has fewer wake-ups than a curve needs (none kept), so the
    # option has none to draw and moves no step
    assert report["terms"]["wake_residual_ms"] is None
    drawn = simulate("wake", "vidur.wake_spread=true") / layout.ENGINE_SCHEDULE
    assert read_csv(drawn, ENGINE_SCHEDULE)["end_time_s"].equals(a["end_time_s"])
    # vidur.busy_spread: the busy steps' fast part from the record's own steps per band of
    # decodes (fitted and reported either way; off by default: the lognormal's)
    bands = report["terms"]["busy_residual"]
    assert bands[0]["n"] >= 30 and bands[0]["p10"] < 0 < bands[0]["p90"]
    busy = simulate("busy", "vidur.busy_spread=true")
    spread = read_csv(busy / layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE)["end_time_s"]
    assert not spread.equals(a["end_time_s"])
