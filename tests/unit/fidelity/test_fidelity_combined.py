"""Fidelity reports together: a multirun's combined report and ``fidelity.summarize``, over new
runs and the argparse harness's reports kept under benchmarks/results/."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpu_simulate_test.config.schema import OutputConfig
from gpu_simulate_test.fidelity import combined, contract
from gpu_simulate_test.fidelity import tables as fid
from gpu_simulate_test.io.artifacts import ArtifactError, read_csv, write_json
from gpu_simulate_test.io.runs import RunExistsError, start_run

REPO = Path(__file__).resolve().parents[3]
OLD_REPORT = REPO / "benchmarks/results/vllm_fidelity_20261123/cpu_qwen3_tiny_vllm-fidelity.json"


def _job(root: Path, run_id: str, backend: str, error: float, partial: bool = False) -> Path:
    percentiles = pd.DataFrame(
        [
            {"metric": m, "stat": s, "real_ms": 10.0, "sim_ms": 10.0 * (1 + error)}
            for m in fid.GOAL_METRICS
            for s in fid.GOAL_STATS
        ]
    )
    table = fid.fidelity_rows([(backend, 0.5, 2.0, percentiles)])
    capacity = {backend: {"probe_requests": 8, "capacity_qps": 4.0, "loads": []}}
    setup = {"device": "CPU", "requests_per_load": 6, "partial": partial,
             "notes": ["stopped part-way"] if partial else []}  # fmt: skip
    with start_run(root, "fidelity", run_id, {}) as r:
        write_json(
            r.file(contract.FIDELITY_JSON), fid.fidelity_json(run_id, setup, capacity, table)
        )
    return r.path


def test_a_multirun_gets_one_combined_report(tmp_path: Path) -> None:
    since = datetime.now(UTC) - timedelta(seconds=1)
    _job(tmp_path, "m-0", "hf_cb", 0.10)
    _job(tmp_path, "m-1", "vllm", -0.30, partial=True)
    _job(tmp_path, "other-0", "vllm", 0.5)  # another multirun's job
    out = OutputConfig(root=str(tmp_path), run_id="m")
    path = combined.write_combined_report(out, since, progress=False)
    assert path == tmp_path / "fidelity" / "m-combined"
    report = (path / contract.REPORT_MD).read_text()
    assert "| m-0 | 6 | hf_cb | 10.0% |" in report
    assert "| m-1 | 6 | vllm | 30.0% |" in report
    assert "other-0" not in report
    assert "(**partial**: stopped part-way)" in report
    assert "[fidelity.json](../m-0/fidelity.json)" in report  # links from where it is written
    rows = read_csv(path / contract.FIDELITY_CSV, contract.FIDELITY_TABLE_WITH_REPORT)
    assert sorted(set(rows["report"])) == ["m-0", "m-1"] and len(rows) == 12
    # a second multirun with that id is refused before any job runs
    with pytest.raises(RunExistsError, match="m-combined already exists"):
        combined.check_combined_free(out)
    # fewer than two jobs with a report, or no run id: no combined report
    assert combined.write_combined_report(OutputConfig(root=str(tmp_path), run_id="other"),
                                          since, progress=False) is None  # fmt: skip
    assert combined.write_combined_report(OutputConfig(root=str(tmp_path)), since) is None


def test_summarize_reads_new_runs_and_old_harness_reports(
    tmp_path: Path, compose_stage: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from gpu_simulate_test.config.fidelity import FidelityStageConfig
    from gpu_simulate_test.config.registry import to_typed

    job = _job(tmp_path, "new", "hf_cb", 0.04)
    cfg = to_typed(
        compose_stage(
            "fidelity",
            [
                f"fidelity.summarize=[{job},{OLD_REPORT}]",
                f"output.root={tmp_path}",
                "output.run_id=sum",
            ],
        ),
        FidelityStageConfig,
    )
    path = combined.summarize(cfg, {})
    summary = (path / contract.SUMMARY_MD).read_text()
    assert "| new | 6 | hf_cb | 4.0% | 4.0% | 6/6 | 6/6 | +4.0% | – |" in summary
    # the vLLM campaign of 2026-11-23, as its report said: 51.9% largest, 32.6% median
    assert "| cpu_qwen3_tiny_vllm | 64 | vllm | 51.9% | 32.6% | 0/18 | 0/18 |" in summary
    assert "cpu_qwen3_tiny_vllm-vllm-latency-vs-load.png" in summary
    assert "| new |" in capsys.readouterr().out


def test_a_report_without_rows_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "x-fidelity.json"
    write_json(bad, {"name": "x", "rows": [{"backend": "hf_cb"}]})
    with pytest.raises(ArtifactError, match=r"x-fidelity\.json: rows\[0\] has no 'abs_rel_error'"):
        combined.read_report(bad)
    with pytest.raises(ArtifactError, match=r"no fidelity\.json"):
        combined.read_report(tmp_path)
