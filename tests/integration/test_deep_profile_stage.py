"""End to end: the deep_profile CLI on the tiny Qwen3, CPU, a two-request synthetic workload."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gpu_simulate_test.deep_profile.nsight.tools import find_tool
from tests.conftest import REPO_ROOT, run_cli

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_deep_profile_on_cpu_reports_mfu_and_skips_nsight(tmp_path: Path) -> None:
    run_cli(
        "deep_profile",
        "model=qwen3_tiny",
        "num_requests=2",
        "workload.prompt_len.value=16",
        "workload.output_len.value=4",
        "pipeline.torch_profiler.chrome_trace=false",
        f"output.root={tmp_path}",
        "output.run_id=t",
        cwd=REPO_ROOT,
    )
    run = tmp_path / "deep_profile" / "t"
    for name in ("env.json", "config.yaml", "inputs.yaml", "report.md", "stakeholder_summary.md"):
        assert (run / name).is_file(), name
    meta = json.loads((run / "run_meta.json").read_text())
    assert meta["status"] == "complete"
    assert meta["steps"] == {
        "static_analysis": "ok",
        "torch_profiler": "ok",
        "nsys": "skipped",
        "ncu": "skipped",
    }

    metrics = json.loads((run / "torch_profiler" / "metrics.json").read_text())
    prefill, decode = metrics["phases"]["prefill"], metrics["phases"]["decode"]
    assert prefill["num_steps"] == 2 and prefill["tokens"] == 32
    assert decode["num_steps"] == 2 * 3  # 4 output tokens: the first from prefill
    # against this host's measured peaks; no upper bound: timing noise or a tiny model's
    # weights in cache can carry a CPU run past the probe's copy bandwidth
    peaks = metrics["hardware"]["peaks"]
    assert peaks["source"] == "measured" and peaks["memory_bandwidth_gb_s"] > 0
    assert metrics["hardware"]["peak_bf16_tflops"] == peaks["peak_tflops"] > 0
    # the key keeps its name; which peak it holds is said beside it, and in report.md
    basis = metrics["hardware"]["peak_tflops_basis"]
    assert basis == "fp32 matmul rate measured on this host"
    assert f"MFU = analytic FLOPs ÷ (time × {basis})" in (run / "report.md").read_text()
    for phase in (prefill, decode):
        assert phase["mfu"] > 0 and phase["mbu"] > 0
        assert phase["achieved_tflops"] == pytest.approx(phase["mfu"] * peaks["peak_tflops"])
    assert metrics["serving"]["output_tokens"] == 8
    ops = pd.read_csv(run / "torch_profiler" / "operators.csv")
    assert "aten::mm" in set(ops["operator"]) or "aten::addmm" in set(ops["operator"])
    assert (run / "torch_profiler" / "operators.md").read_text().startswith("# Operators")
    steps = pd.read_csv(run / "static_analysis" / "step_costs.csv")
    assert set(steps["phase"]) == {"prefill", "decode"}
    # the roofline too stands on the measured peaks, the same probe as MFU's
    static = json.loads((run / "static_analysis" / "static_analysis.json").read_text())
    assert static["peaks"]["source"] == "measured"
    assert static["peaks"]["peak_tflops"] == peaks["peak_tflops"]
    assert (
        "roofline peaks (measured on this host)"
        in (run / "static_analysis" / "static_analysis.md").read_text()
    )

    report = (run / "report.md").read_text()
    # on CPU both Nsight steps skip for the device; where the tool is missing too, that first
    cpu = "hardware.device=cpu: Nsight profiles CUDA kernels (use a GPU hardware)"
    nsys_missing = [] if find_tool("nsys") else ["nsys not found on PATH or in CUDA directories"]
    ncu_missing = [] if find_tool("ncu") else ["ncu not found on PATH or in CUDA directories"]
    assert f"| nsys | skipped | {'; '.join([*nsys_missing, cpu])} |" in report
    assert f"| ncu | skipped | {'; '.join([*ncu_missing, cpu])} |" in report
    assert "hardware.device=cpu" in report
    assert "MFU" in report and "aten::" in report
    command = json.loads((run / "nsys" / "command.json").read_text())
    assert command["status"] == "skipped" and "pipeline.run_workload.enable=true" in command["argv"]
    assert "three biggest costs" in (run / "stakeholder_summary.md").read_text()
