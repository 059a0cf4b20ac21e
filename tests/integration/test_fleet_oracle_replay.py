"""A fleet's oracle replay end to end, as a user runs it: a real vLLM ``--data-parallel-size 2``
run (its two schedulers' record, in the test data) replayed by ``vidur_simulate
step_times_from=<run> fleet.replicas=2 fleet.router=vllm_dp``, each simulated engine timed by
its real engine's steps, then ``compare``: the routing table, the same-replica share, each
engine's steps aligned; a replay with the wrong number of replicas is refused by name."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.io.schemas import ENGINE_SCHEDULE, REQUEST_METRICS
from tests.conftest import run_cli
from tests.integration.test_oracle_replay import oracle_project

pytestmark = pytest.mark.integration

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm" / "step_record_dp2"


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return oracle_project(tmp_path_factory.mktemp("fleet_oracle"), DATA, "dp2")


def test_a_fleet_oracle_replay_routes_and_steps_as_the_real_fleet(project: Path) -> None:
    run_cli(
        "vidur_simulate",
        "workload_dir=tmp/workload/w",
        "step_times_from=tmp/real_bench/dp2",
        "fleet.replicas=2",
        "fleet.router=vllm_dp",
        "output.run_id=oracle",
        "vidur.predictor.num_training_job_threads=1",
        cwd=project,
    )
    sim = project / "tmp" / "vidur_simulate" / "oracle"
    meta = read_json(sim / layout.RUN_META)
    assert meta["oracle"]["engines"] == 2 and meta["oracle"]["exact"]
    assert [e["real_steps"] for e in meta["oracle"]["per_engine"]] == [628, 564]
    requests = read_csv(sim / layout.REQUEST_METRICS, REQUEST_METRICS)
    assert set(requests["engine"]) == {0, 1}
    schedule = read_csv(sim / layout.ENGINE_SCHEDULE, ENGINE_SCHEDULE)
    assert set(schedule["engine"]) == {0, 1}

    proc = run_cli(
        "compare",
        "real_run_dir=tmp/real_bench/dp2",
        "sim_run_dir=tmp/vidur_simulate/oracle",
        "output.run_id=c",
        cwd=project,
    )
    data = read_json(project / "tmp" / "compare" / "c" / "comparison.json")
    routing = data["routing"]
    assert routing["replicas"] == 2 and routing["compared"] == 60
    assert [r["real_requests"] for r in routing["per_replica"]] == [31, 29]
    assert all(abs(r["sim_requests"] - r["real_requests"]) <= 2 for r in routing["per_replica"])
    # decided at the client's sends on the coordinator's stale counts: most requests (78% here;
    # a router blind to the engines would agree on about half)
    assert routing["same_replica_fraction"] >= 0.7
    assert meta["oracle"]["routed_at"] == "the client's send"
    per_engine = data["steps"]["alignment_per_engine"]
    assert [a["engine"] for a in per_engine] == [0, 1]
    summary = (project / "tmp" / "compare" / "c" / "summary.md").read_text()
    assert "## Routing (a fleet)" in summary and "engine 1" in summary
    assert proc.returncode == 0


def test_a_fleet_run_replayed_as_one_engine_is_refused(project: Path) -> None:
    proc = run_cli(
        "vidur_simulate",
        "workload_dir=tmp/workload/w",
        "step_times_from=tmp/real_bench/dp2",
        "output.run_id=one",
        "vidur.predictor.num_training_job_threads=1",
        cwd=project,
        check=False,
    )
    assert proc.returncode != 0
    said = proc.stdout + proc.stderr
    assert "ran 2 engine(s)" in said and "fleet.replicas=2 fleet.router=vllm_dp" in said
