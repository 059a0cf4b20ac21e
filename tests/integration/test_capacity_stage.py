"""The capacity stage through its CLI: a synthetic bundle, transformers' knobs, a short workload;
the answer brackets the goals on the curve it wrote, and the real engine checks it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest

from gpu_simulate_test.capacity import contract
from gpu_simulate_test.capacity.band import in_band
from gpu_simulate_test.io.artifacts import read_csv
from tests.conftest import run_cli
from tests.vidur_bundle_factory import write_synthetic_bundle

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def synthetic(tmp_path: Path) -> list[str]:
    """transformers' engine (no server to start) and a synthetic bundle far faster than it."""
    write_synthetic_bundle(tmp_path / "profiles")
    return [
        "backend=hf_cb",
        "backend.max_requests_per_batch=8",
        "engine_overhead=false",  # the synthetic bundle has no engine calibration
        f"profiling_root={tmp_path / 'profiles'}",
    ]


def test_capacity_search_and_its_real_check(tmp_path: Path) -> None:
    proc = run_cli(
        "capacity",
        *synthetic(tmp_path),
        "workload.num_requests=60",
        "capacity.slo.ttft_ms=2",  # the synthetic bundle is fast: sub-ms steps
        "capacity.slo.tpot_ms=0",
        "capacity.qps_min=10",
        "capacity.qps_max=100000",
        "capacity.points=6",
        "capacity.refine=2",
        "capacity.verify=true",
        "num_warmup_requests=1",
        "output.run_id=c",
        cwd=tmp_path,
    )
    run = tmp_path / "tmp" / "capacity" / "c"
    doc = json.loads((run / contract.CAPACITY_JSON).read_text())
    curve = read_csv(run / contract.CAPACITY_CSV, contract.CAPACITY_TABLE)
    assert len(curve) == 8 and list(curve["phase"]).count("refine") == 2
    low, high = doc["bracket_qps"]
    assert doc["answer_qps"] == low
    # the curve agrees with the answer: every rate up to it met the goal, the next one did not
    assert curve[curve["qps"] <= low]["meets_slo"].all()
    assert not curve[curve["qps"] == high]["meets_slo"].any()
    assert (curve[curve["qps"] <= low]["ttft_p90_ms"] <= 2).all()
    assert doc["binding"] and doc["binding"][0].startswith("ttft_p90 ")
    # the same search with steps 10% slower and 10% faster: the band holds the answer
    band = doc["step_band"]
    assert band["fraction"] == 0.1 and band["slower"]["step_time_scale"] == 1.1
    slower, faster = band["qps"]
    assert slower is not None and faster is not None and slower <= low <= faster
    assert (run / contract.POINTS_DIR / "steps-x1.1").is_dir()
    assert (run / contract.POINTS_DIR / "steps-x0.9").is_dir()
    assert "answer with steps ±10% (req/s)" in proc.stdout
    assert "If every step took 10% longer" in (run / contract.REPORT_MD).read_text()
    # the real engine replayed the workload at the answer, judged by the same goal
    check = doc["verify"]
    assert check["qps"] == low and isinstance(check["meets_slo"], bool)
    assert (tmp_path / check["real_run"] / "request_metrics.csv").is_file()  # relative to cwd
    assert set(check["real_ms"]) >= {"ttft_p90", "tpot_p90", "e2e_p90"}
    assert (run / contract.CAPACITY_PLOT).stat().st_size > 20_000
    assert "Highest rate within the goals" in (run / contract.REPORT_MD).read_text()
    assert "answer (req/s)" in proc.stdout
    # no goal at all: one line, nothing run
    bad = run_cli("capacity", "capacity.slo.ttft_ms=0", "capacity.slo.tpot_ms=0",
                  "output.run_id=bad", cwd=tmp_path, check=False)  # fmt: skip
    assert bad.returncode == 2 and "set at least one of" in bad.stdout
    assert not (tmp_path / "tmp" / "capacity" / "bad").exists()


def test_the_same_search_on_the_real_engine(tmp_path: Path) -> None:
    """capacity.verify=search: the grid and bisection replayed on the real engine, its curve and
    its measured capacity beside the answer (hf_cb; a synthetic bundle far faster than it)."""
    proc = run_cli(
        "capacity",
        *synthetic(tmp_path),
        "workload.num_requests=40",
        "capacity.slo.ttft_ms=0",
        "capacity.slo.e2e_ms=400",  # the tiny model on CPU: E2E p90 about 200-350 ms here
        "capacity.qps_min=4",
        "capacity.qps_max=4000",
        "capacity.points=3",
        "capacity.refine=1",
        "capacity.verify=search",
        "capacity.verify_requests=16",
        "num_warmup_requests=1",
        "output.run_id=s",
        cwd=tmp_path,
    )
    run = tmp_path / "tmp" / "capacity" / "s"
    doc = json.loads((run / contract.CAPACITY_JSON).read_text())
    check = doc["verify"]
    assert check["mode"] == "search" and check["requests_per_rate"] == 16
    real = read_csv(run / contract.CAPACITY_REAL_CSV, contract.CAPACITY_TABLE)
    assert len(real) == len(check["runs"]) >= 3
    assert set(real["phase"]) <= {"grid", "refine"}
    # every real rate replayed 16 requests on the real engine, judged by the same goal
    for rec in check["runs"]:
        metrics = pd.read_csv(tmp_path / rec["real_run"] / "request_metrics.csv")
        assert len(metrics) == 16
        passed = real[real["qps"] == rec["qps"]]["meets_slo"].item()
        assert passed == rec["meets_slo"]
    measured = check["measured_capacity_qps"]
    if measured is not None:
        assert real[real["qps"] <= measured]["meets_slo"].all()
        assert check["ratio"] == pytest.approx(doc["answer_qps"] / measured)
    assert check["measured_in_band"] == in_band(measured, doc["step_band"])
    assert "measured within the band" in proc.stdout
    assert "measured capacity (req/s)" in proc.stdout
    report = (run / contract.REPORT_MD).read_text()
    assert "On the real engine, the same search" in report and "real engine's curve" in report
    assert "goodput (req/s)" in report
    # a mode that does not exist: one line, nothing run
    bad = run_cli("capacity", "capacity.verify=maybe", "output.run_id=bad", cwd=tmp_path,
                  check=False)  # fmt: skip
    assert bad.returncode == 2 and "must be one of false, answer (true), search" in bad.stdout


def test_real_phase_then_sim_phase_elsewhere(tmp_path: Path) -> None:
    """capacity.phase=real: the bundle and the real search only (the GPU machine's half); its run
    directory moved elsewhere, capacity.phase=sim simulates the search and sets it beside the
    recorded real one, with the engine, bundle and workload the real phase used."""
    from gpu_simulate_test.capacity.split import MANIFEST_FILE

    gpu, here = tmp_path / "gpu", tmp_path / "here"
    gpu.mkdir()
    here.mkdir()
    goals = ["capacity.slo.ttft_ms=0", "capacity.slo.e2e_ms=400"]
    search = ["capacity.qps_min=4", "capacity.qps_max=4000", "capacity.points=3",
              "capacity.refine=1", "capacity.step_band=0"]  # fmt: skip
    run_cli(
        "capacity", *synthetic(gpu), "workload.num_requests=40", *goals, *search,
        "capacity.phase=real", "capacity.verify_requests=16", "num_warmup_requests=1",
        "output.run_id=real", cwd=gpu,
    )  # fmt: skip
    real = gpu / "tmp" / "capacity" / "real"
    assert json.loads((real / "run_meta.json").read_text())["status"] == "complete"
    assert not (real / contract.CAPACITY_JSON).exists()  # the real phase simulates nothing
    assert not (real / contract.POINTS_DIR).exists()
    manifest = json.loads((real / MANIFEST_FILE).read_text())
    assert manifest["profiling_root"] == "runs/profiles"  # its bundle travels with it
    assert (real / "runs" / "profiles" / "cpu" / "qwen3_tiny" / "meta.json").is_file()
    assert manifest["workload_dir"] == "runs/workload/base"
    assert manifest["config"]["backend"]["name"] == "hf_cb"
    assert all(run["real_run"].startswith("runs/real_bench/search-") for run in manifest["runs"])
    curve = read_csv(real / contract.CAPACITY_REAL_CSV, contract.CAPACITY_TABLE)
    assert len(curve) == len(manifest["runs"]) == len(manifest["measured"]["points"]) >= 3

    moved = here / "from_gpu"
    shutil.move(real, moved)  # every path in the manifest is relative: it still reads
    shutil.rmtree(gpu)  # the bundle it was profiled into is gone: the run carries its own
    # the search the real phase ran, or none: another grid is refused
    other_grid = run_cli(
        "capacity", "capacity.phase=sim", "capacity.real_from=from_gpu", *goals, *search,
        "capacity.points=4", "output.run_id=grid", cwd=here, check=False,
    )  # fmt: skip
    assert other_grid.returncode == 2 and "the real search ran the grid" in other_grid.stdout
    proc = run_cli(
        "capacity", "capacity.phase=sim", "capacity.real_from=from_gpu", *goals, *search,
        "engine_overhead=false", "output.run_id=sim", cwd=here,
    )  # fmt: skip
    sim = here / "tmp" / "capacity" / "sim"
    doc = json.loads((sim / contract.CAPACITY_JSON).read_text())
    assert doc["backend"] == "hf_cb" and doc["answer_qps"] is not None
    check = doc["verify"]
    assert check["mode"] == "search" and check["requests_per_rate"] == 16
    assert check["measured_capacity_qps"] == manifest["measured"]["qps"]
    for rec in check["runs"]:  # the real runs, read where they now are (real_from resolved)
        assert Path(rec["real_run"]).is_absolute()
        assert (Path(rec["real_run"]) / "request_metrics.csv").is_file()
        assert str(moved.resolve()) in rec["real_run"]
    meta = json.loads((sim / "run_meta.json").read_text())
    assert meta["real_from"] == str(moved.resolve())
    assert meta["recorded_config"]["backend"]["name"] == "hf_cb"
    again = read_csv(sim / contract.CAPACITY_REAL_CSV, contract.CAPACITY_TABLE)
    pd.testing.assert_frame_equal(again, curve)
    assert "On the real engine, the same search" in (sim / contract.REPORT_MD).read_text()
    assert "measured capacity (req/s)" in proc.stdout
    # other goals than the real search was judged by: one line, no run directory
    other = run_cli(
        "capacity", "capacity.phase=sim", f"capacity.real_from={moved}", *search,
        "output.run_id=other", cwd=here, check=False,
    )  # fmt: skip
    assert other.returncode == 2 and "the real search was judged by" in other.stdout
    assert not (here / "tmp" / "capacity" / "other").exists()
    # a directory that is no real phase's, and a sim phase with nowhere to read from
    wrong = run_cli(
        "capacity", "capacity.phase=sim", f"capacity.real_from={sim}", *goals,
        "output.run_id=wrong", cwd=here, check=False,
    )  # fmt: skip
    assert wrong.returncode == 2 and f"{MANIFEST_FILE}: missing" in wrong.stdout
    (sim / MANIFEST_FILE).write_text((moved / MANIFEST_FILE).read_text())  # a sim run's, posing
    posing = run_cli(
        "capacity", "capacity.phase=sim", f"capacity.real_from={sim}", *goals, *search,
        "output.run_id=posing", cwd=here, check=False,
    )  # fmt: skip
    assert posing.returncode == 2 and "is a capacity.phase=sim run" in posing.stdout
    bare = run_cli("capacity", "capacity.phase=sim", "output.run_id=bare", cwd=here, check=False)
    assert bare.returncode == 2 and "needs capacity.real_from" in bare.stdout
