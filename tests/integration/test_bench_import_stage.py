"""bench_import end to end, as a user runs it: a real ``vllm bench serve`` result and a real
GuideLLM report imported, simulated and compared; our runs exported and read back; bad files
refused in one line with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.io.schemas import REQUEST_METRICS
from tests.conftest import REPO_ROOT, run_cli
from tests.vidur_bundle_factory import QWEN3_0_6B, QWEN3_TINY, write_synthetic_bundle

pytestmark = pytest.mark.integration

VLLM_FIXTURE = REPO_ROOT / "tests" / "data" / "vllm" / "vllm_bench_serve_q06b.json"
GUIDELLM_FIXTURE = REPO_ROOT / "tests" / "data" / "guidellm" / "guidellm_benchmarks_tiny.json"
FAST = ("vidur.predictor.num_training_job_threads=1", "progress=false")


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bench_import")
    write_synthetic_bundle(root / "tmp" / "profiles", QWEN3_0_6B, points=12)
    write_synthetic_bundle(root / "tmp" / "profiles", QWEN3_TINY, points=12)
    return root


def test_vllm_bench_result_imports_simulates_compares_and_exports(project: Path) -> None:
    proc = run_cli("bench_import", f"source={VLLM_FIXTURE}", "model=qwen3_0_6b",
                   "output.run_id=v", cwd=project)  # fmt: skip
    assert "confirmed" in proc.stdout and "differs" not in proc.stdout
    real = project / "tmp" / "real_bench" / "v"
    meta = read_json(real / layout.RUN_META)
    assert meta["status"] == "complete" and meta["imported"]["tool"] == "vllm_bench_serve"
    conventions = meta["imported"]["conventions"]
    assert all(c["agrees"] for c in conventions.values() if c["checked"])
    assert not conventions["sampling"]["checked"]  # not in the file: said, not claimed
    assert len(read_csv(real / layout.REQUEST_METRICS, REQUEST_METRICS)) == 50

    run_cli("vidur_simulate", "workload_dir=tmp/workload/v", "model=qwen3_0_6b",
            "output.run_id=v", *FAST, cwd=project)  # fmt: skip
    run_cli("compare", "real_run_dir=tmp/real_bench/v", "sim_run_dir=tmp/vidur_simulate/v",
            "output.run_id=v", "compare.plots=false", "progress=false", cwd=project)  # fmt: skip
    comparison = read_json(project / "tmp" / "compare" / "v" / "comparison.json")
    assert comparison["num_compared"] == 50
    assert comparison["metrics"]["ttft"]["real"]["p50"] == pytest.approx(0.35794008, rel=1e-6)

    # the simulated run and the imported one, back out as vllm bench results
    fixture = json.loads(VLLM_FIXTURE.read_text())
    for stage in ("vidur_simulate", "real_bench"):
        run_cli("bench_import", f"export_from=tmp/{stage}/v", f"output.run_id=x-{stage}",
                cwd=project)  # fmt: skip
        out = json.loads((project / "tmp/bench_import" / f"x-{stage}" / "vllm_bench_serve.json")
                         .read_text())  # fmt: skip
        assert list(out) == list(fixture), stage
        assert out["completed"] == 50 and len(out["itls"]) == 50
    assert out["median_ttft_ms"] == pytest.approx(fixture["median_ttft_ms"])
    assert out["itls"][0] == pytest.approx(fixture["itls"][0])


def test_guidellm_report_imports_each_benchmark_and_simulates(project: Path) -> None:
    proc = run_cli("bench_import", f"source={GUIDELLM_FIXTURE}", "output.run_id=g",
                   cwd=project)  # fmt: skip
    manifest = read_json(project / "tmp" / "bench_import" / "g" / "import.json")
    assert manifest["tool"] == "guidellm" and len(manifest["runs"]) == 2
    assert "differs" not in proc.stdout
    for k, entry in enumerate(manifest["runs"]):
        real = project / "tmp" / "real_bench" / f"g-{k}"
        table = read_csv(real / layout.REQUEST_METRICS, REQUEST_METRICS)
        assert len(table) == entry["num_requests"] >= 10
        assert (table["num_prefill_tokens"] > 0).all() and (table["num_decode_tokens"] > 1).all()
    run_cli("vidur_simulate", "workload_dir=tmp/workload/g-1", "output.run_id=g-1", *FAST,
            cwd=project)  # fmt: skip
    run_cli("compare", "real_run_dir=tmp/real_bench/g-1", "sim_run_dir=tmp/vidur_simulate/g-1",
            "output.run_id=g-1", "compare.plots=false", "progress=false", cwd=project)  # fmt: skip
    comparison = read_json(project / "tmp" / "compare" / "g-1" / "comparison.json")
    assert comparison["num_compared"] == manifest["runs"][1]["num_requests"]


def _edit(data: dict, edit: str) -> None:
    """One way a result file can be wrong (request 3 of 50 where it is one request's)."""
    if edit == "drop_detailed":
        for key in ("input_lens", "output_lens", "start_times", "ttfts", "itls", "errors"):
            del data[key]
    elif edit == "itl_null":
        data["itls"][3][0] = None
    elif edit == "start_nan":
        data["start_times"][3] = float("nan")
    elif edit in ("output_null", "output_text"):
        data["output_lens"][3] = None if edit == "output_null" else "abc"
    elif edit == "input_fraction":
        data["input_lens"][3] = 1.5
    elif edit == "empty":
        for key in ("input_lens", "output_lens", "start_times", "ttfts", "itls", "errors"):
            data[key] = []


@pytest.mark.parametrize(
    ("edit", "overrides", "expected"),
    [
        ("drop_detailed", (), ["'input_lens'", "--save-detailed"]),
        ("none", ("model.max_position_embeddings=150",), ["'input_lens'", "model="]),
        ("itl_null", (), ["'itls'", "request 3", "null or NaN"]),
        ("start_nan", (), ["'start_times'", "request 3", "null or NaN"]),
        ("output_null", (), ["'output_lens[3]' is None", "token count"]),
        ("output_text", (), ["'output_lens[3]' is 'abc'", "token count"]),
        ("input_fraction", (), ["'input_lens[3]' is 1.5", "whole number"]),
        ("empty", (), ["'input_lens' is empty"]),
    ],
    ids=["no-save-detailed", "lengths-over-model", "itl-null", "start-nan", "output-null",
         "output-text", "input-fraction", "no-requests"],
)  # fmt: skip
def test_bad_files_fail_in_one_line_with_exit_2(
    project: Path, edit: str, overrides: tuple[str, ...], expected: list[str]
) -> None:
    data = json.loads(VLLM_FIXTURE.read_text())
    _edit(data, edit)
    path = project / f"{edit}.json"
    path.write_text(json.dumps(data))
    proc = run_cli("bench_import", f"source={path}", "model=qwen3_0_6b", *overrides,
                   f"output.run_id=bad-{edit}", cwd=project, check=False)  # fmt: skip
    assert proc.returncode == 2
    lines = [line for line in proc.stdout.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and str(path) in lines[0], proc.stdout
    for text in expected:
        assert text in lines[0]
    for stage in ("workload", "real_bench"):  # refused before any run is written
        assert not (project / "tmp" / stage / f"bad-{edit}").exists()


def test_a_truth_that_fails_to_write_leaves_no_complete_workload(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpu_simulate_test.bench_import import stage

    def fails(*_: object, **__: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(stage, "write_imported_truth", fails)
    proc = run_cli("bench_import", f"source={VLLM_FIXTURE}", "model=qwen3_0_6b",
                   "output.run_id=half", cwd=project, check=False, subprocess_=False)  # fmt: skip
    assert proc.returncode != 0
    for name in ("workload", "real_bench", "bench_import"):
        meta = read_json(project / "tmp" / name / "half" / layout.RUN_META)
        assert meta["status"] == "failed" and "disk full" in meta["error"], name


def test_an_overwrite_replaces_only_its_own_ids_runs(project: Path) -> None:
    run_cli("bench_import", f"source={VLLM_FIXTURE}", "model=qwen3_0_6b", "output.run_id=ow-1",
            cwd=project)  # fmt: skip
    before = read_json(project / "tmp" / "workload" / "ow-1" / layout.RUN_META)
    # a GuideLLM report of two runs as ow: its second run, ow-1, is another launch's id
    proc = run_cli("bench_import", f"source={GUIDELLM_FIXTURE}", "model=qwen3_tiny",
                   "output.run_id=ow", "output.overwrite=true", cwd=project,
                   check=False)  # fmt: skip
    assert proc.returncode == 2
    assert "is not a run of bench_import output.run_id=ow" in " ".join(proc.stdout.split())
    assert read_json(project / "tmp" / "workload" / "ow-1" / layout.RUN_META) == before
    assert not (project / "tmp" / "bench_import" / "ow").exists()
    # its own id's runs it replaces
    run_cli("bench_import", f"source={VLLM_FIXTURE}", "model=qwen3_0_6b", "output.run_id=ow-1",
            "output.overwrite=true", cwd=project)  # fmt: skip
    again = read_json(project / "tmp" / "workload" / "ow-1" / layout.RUN_META)
    assert again["status"] == "complete" and again["start_time"] != before["start_time"]
    # a workload stage's run of the same id is another stage's: refused too
    run_cli("workload", "model=qwen3_tiny", "workload.num_requests=4", "output.run_id=ow-w",
            "progress=false", cwd=project)  # fmt: skip
    stage_run = read_json(project / "tmp" / "workload" / "ow-w" / layout.RUN_META)
    proc = run_cli("bench_import", f"source={VLLM_FIXTURE}", "model=qwen3_0_6b",
                   "output.run_id=ow-w", "output.overwrite=true", cwd=project,
                   check=False)  # fmt: skip
    assert proc.returncode == 2 and "is not a run of bench_import" in " ".join(proc.stdout.split())
    assert read_json(project / "tmp" / "workload" / "ow-w" / layout.RUN_META) == stage_run
