"""The capacity stage through its CLI: a synthetic bundle, transformers' knobs, a short workload;
the answer brackets the goals on the curve it wrote, and the real engine checks it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_simulate_test.capacity import contract
from gpu_simulate_test.io.artifacts import read_csv
from tests.conftest import run_cli
from tests.vidur_bundle_factory import write_synthetic_bundle

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_capacity_search_and_its_real_check(tmp_path: Path) -> None:
    write_synthetic_bundle(tmp_path / "profiles")
    proc = run_cli(
        "capacity",
        "backend=hf_cb",
        "backend.max_requests_per_batch=8",
        "engine_overhead=false",  # the synthetic bundle has no engine calibration
        f"profiling_root={tmp_path / 'profiles'}",
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
