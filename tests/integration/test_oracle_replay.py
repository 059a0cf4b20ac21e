"""Oracle replay end to end, as a user runs it: ``vidur_simulate step_times_from=<real run>``
on a real vLLM run that preempted (its scheduler's own record, in the test data), then
``compare``: every step the same, the same preemptions, the engine's own latencies."""

from __future__ import annotations

import shutil
from pathlib import Path

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


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("oracle")
    shutil.copytree(DATA / "workload", root / "tmp" / "workload" / "w")
    shutil.copytree(
        DATA, root / "tmp" / "real_bench" / "v", ignore=shutil.ignore_patterns("workload")
    )
    ranges = SyntheticRanges(max_num_tokens=4096, max_kv_cache_size=4096, block_size=32)
    write_synthetic_bundle(root / "tmp" / "profiles", QWEN3_TINY, ranges=ranges, points=8)
    return root


def test_an_oracle_replay_of_a_preempting_vllm_run_takes_every_step_vllm_took(
    project: Path,
) -> None:
    run_cli(
        "vidur_simulate",
        "workload_dir=tmp/workload/w",
        "step_times_from=tmp/real_bench/v",
        "output.run_id=oracle",
        *V1,
        cwd=project,
    )
    sim = project / "tmp" / "vidur_simulate" / "oracle"
    meta = read_json(sim / layout.RUN_META)
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


def test_an_oracle_replay_needs_vllm_s_scheduler(project: Path) -> None:
    proc = run_cli(
        "vidur_simulate",
        "workload_dir=tmp/workload/w",
        "step_times_from=tmp/real_bench/v",
        "vidur.scheduler.name=sarathi",
        cwd=project,
        check=False,
    )
    assert proc.returncode != 0
    assert "vidur.scheduler.name=vllm_v1" in proc.stdout + proc.stderr
