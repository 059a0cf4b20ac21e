"""The fidelity sim phase on a bench_import run, as a user runs it: a real GuideLLM sweep and a
real ``vllm bench serve`` result (appended twice: two runs at one rate) imported, then simulated,
compared and reported like a campaign of ours; bad imports refused in one line with exit code 2,
before any run directory is made."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from gpu_simulate_test.fidelity import contract
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.io.schemas import REQUEST_METRICS
from tests.conftest import REPO_ROOT, run_cli
from tests.vidur_bundle_factory import (
    QWEN3_0_6B,
    QWEN3_TINY,
    SyntheticRanges,
    write_synthetic_bundle,
)

pytestmark = pytest.mark.integration

VLLM_FIXTURE = REPO_ROOT / "tests" / "data" / "vllm" / "vllm_bench_serve_q06b.json"
GUIDELLM_FIXTURE = REPO_ROOT / "tests" / "data" / "guidellm" / "guidellm_benchmarks_tiny.json"
SIM = (
    "fidelity.phase=sim",
    "engine_overhead=false",  # a synthetic bundle: Vidur's per-op model, no engine calibration
    "fidelity.warmup_s=0",  # 16 requests at 2 req/s: the default 5 s would leave few measured
    "vidur.predictor.num_training_job_threads=1",
    "progress=false",
)
ROWS_PER_LOAD = 3 * 2
"""(ttft, tpot, e2e) × (p50, p90) on the client's clock (an imported run has no engine clock)."""


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Bundles for the vllm backend's blocks of 32, and both fixtures imported: ``g`` (GuideLLM,
    two benchmarks: ``g-0``, ``g-1``) and ``v`` (the vllm bench result appended twice)."""
    root = tmp_path_factory.mktemp("fidelity_import")
    for model in (QWEN3_0_6B, QWEN3_TINY):
        ctx = model.max_position_embeddings
        ranges = SyntheticRanges(max_num_tokens=ctx, max_kv_cache_size=ctx, block_size=32)
        write_synthetic_bundle(root / "tmp" / "profiles", model, ranges=ranges, points=12)
    run_cli("bench_import", f"source={GUIDELLM_FIXTURE}", "output.run_id=g", "progress=false",
            cwd=root)  # fmt: skip
    twice = root / "appended.json"  # as vllm bench serve --append-result writes: one a line
    line = json.dumps(json.loads(VLLM_FIXTURE.read_text()))
    twice.write_text(line + "\n" + line + "\n")
    run_cli("bench_import", f"source={twice}", "model=qwen3_0_6b", "output.run_id=v",
            "progress=false", cwd=root)  # fmt: skip
    return root


def offered_qps(real_dir: Path) -> float:
    """The rate an imported run's arrivals realized, to 4 significant digits."""
    arrivals = read_csv(real_dir / layout.REQUEST_METRICS, REQUEST_METRICS)["arrival_time_s"]
    return float(f"{(len(arrivals) - 1) / float(arrivals.max() - arrivals.min()):.4g}")


@pytest.mark.slow
def test_guidellm_sweep_is_a_campaign_of_two_loads(project: Path) -> None:
    run_cli("fidelity", *SIM, "fidelity.real_from=tmp/bench_import/g", "output.run_id=fg",
            cwd=project)  # fmt: skip
    out = project / "tmp" / "fidelity" / "fg"
    data = read_json(out / contract.FIDELITY_JSON)
    assert data["phase"] == "sim" and data["real_from"] == "tmp/bench_import/g"
    assert data["imported"]["tool"] == "guidellm"
    # the 4 req/s benchmark overran the tiny engine: a real finding, so the report is partial
    assert data["partial"] and any("did not keep up" in note for note in data["notes"])
    rates = [offered_qps(project / "tmp" / "real_bench" / f"g-{k}") for k in (0, 1)]
    assert rates[0] < rates[1]  # Poisson at 2 and at 4 req/s
    cap = data["capacity"]["vllm"]
    assert cap["capacity_qps"] == rates[1] and cap["derived_from"] == "highest offered rate"

    # one row set per imported run: its rate, and the real figures of that run
    table = read_csv(out / contract.FIDELITY_CSV, contract.FIDELITY_TABLE)
    assert len(table) == 2 * ROWS_PER_LOAD and set(table["clock"]) == {"client"}
    assert sorted(set(table["offered_qps"])) == rates
    assert sorted(set(table["load_fraction"])) == [float(f"{rates[0] / rates[1]:.4g}"), 1.0]
    assert "noise" not in table.columns  # one run per rate: no real vs real
    for k, rate in enumerate(rates):
        real = read_csv(project / "tmp/real_bench" / f"g-{k}" / layout.REQUEST_METRICS,
                        REQUEST_METRICS)  # fmt: skip
        row = table[(table["offered_qps"] == rate) & (table["metric"] == "ttft")
                    & (table["stat"] == "p50")]  # fmt: skip
        assert len(row) == 1
        assert row["real_ms"].iloc[0] == pytest.approx(np.median(real["ttft_s"]) * 1e3)
        assert np.isfinite(row["sim_ms"].iloc[0]) and row["sim_ms"].iloc[0] > 0
    assert len(cap["loads"]) == len(rates)  # one load a rate, each compared
    for level in cap["loads"]:
        assert (project / level["compare_run"] / "comparison.json").is_file()  # cwd-relative
    assert (out / contract.plot_name("vllm")).stat().st_size > 20_000

    report = (out / contract.REPORT_MD).read_text()
    assert "## Imported runs" in report and "## Table (ms)" in report
    assert "**Capacity**: the highest offered rate among the imported runs" in report
    assert "**Noise floor**: unknown for the loads at" in report
    assert "**Scheduler check**: not made" in report
    assert "Not checked for disturbance (not judged: guidellm" in report
    assert "real vs real |" not in report  # no noise columns in the table


@pytest.mark.slow
def test_two_vllm_results_at_one_rate_are_a_load_and_its_noise_floor(project: Path) -> None:
    run_cli("fidelity", *SIM, "fidelity.real_from=tmp/bench_import/v", "model=qwen3_0_6b",
            "fidelity.capacity_qps=8", "output.run_id=fv", cwd=project)  # fmt: skip
    out = project / "tmp" / "fidelity" / "fv"
    data = read_json(out / contract.FIDELITY_JSON)
    roles = [run["role"] for run in data["imported"]["runs"]]
    assert roles == ["load 0", "load 0, real repeat"]  # both told 4 req/s
    assert data["real_runs_per_load"] == 2
    assert data["capacity"]["vllm"]["derived_from"] == "fidelity.capacity_qps"
    table = read_csv(out / contract.FIDELITY_CSV, contract.FIDELITY_TABLE)
    rate = offered_qps(project / "tmp" / "real_bench" / "v-0")
    assert len(table) == ROWS_PER_LOAD and set(table["offered_qps"]) == {rate}
    assert set(table["load_fraction"]) == {float(f"{rate / 8:.4g}")}
    noise = table["noise"].astype(float)  # an optional column: read back as text
    assert (noise == 0).all()  # the same result twice: real vs real is exactly 0
    report = (out / contract.REPORT_MD).read_text()
    assert "**Capacity**: fidelity.capacity_qps=8, given on the command line" in report
    assert "**Noise floor**: from the imported runs at the same rate" in report
    assert "real vs real (noise floor)" in report


def _broken_copy(project: Path, name: str, edit: str) -> Path:
    """A copy of the import ``g`` with its import.json removed, unreadable or short of a field."""
    copy = project / "tmp" / "bench_import" / name
    shutil.copytree(project / "tmp" / "bench_import" / "g", copy)
    manifest = copy / "import.json"
    if edit == "missing":
        manifest.unlink()
    elif edit == "not_json":
        manifest.write_text('{"schema_version": "1.0", "runs": [')
    else:
        data = json.loads(manifest.read_text())
        del data["runs"][1]["real_dir"]
        manifest.write_text(json.dumps(data))
    return copy


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", ["import.json: missing"]),
        ("not_json", ["import.json: not valid JSON"]),
        ("no_field", ["import.json: field 'runs[1].real_dir'"]),
        ("other_model", ["workload_meta.json: field 'model' is 'qwen3_0_6b'", "model=qwen3_0_6b"]),
    ],
)
def test_bad_imports_fail_in_one_line_with_exit_2(
    project: Path, case: str, expected: list[str]
) -> None:
    if case == "other_model":  # v was imported for qwen3_0_6b; the stage's default is qwen3_tiny
        src = project / "tmp" / "bench_import" / "v"
    else:
        src = _broken_copy(project, f"bad-{case}", case)
    proc = run_cli("fidelity", *SIM, f"fidelity.real_from={src}", f"output.run_id=bad-{case}",
                   cwd=project, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stdout
    for text in expected:
        assert text in lines[0]
    assert not (project / "tmp" / "fidelity" / f"bad-{case}").exists()
