"""Nsight argv builders, top-kernel extraction and its CLI, tool lookup and step outcomes."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gpu_simulate_test.deep_profile.nsight.commands import (
    NcuPage,
    ncu_import_csv_argv,
    ncu_profile_argv,
    nsys_profile_argv,
    nsys_stats_argv,
    nsys_stats_outputs,
)
from gpu_simulate_test.deep_profile.nsight.parsers import KernelRecord, parse_kernel_summary
from gpu_simulate_test.deep_profile.nsight.tools import StepOutcome, find_tool, require_tool
from gpu_simulate_test.deep_profile.nsight.top_kernels import (
    extract_top_kernels,
    kernel_name_regex,
    main,
)
from tests.conftest import REPO_ROOT, SHARED_FIXTURES

APP = ["python", "-m", "bench", "--steps", "3"]
BASE = ["nsys", "profile", "--trace=cuda,nvtx,osrt", "--sample=none", "--cpuctxsw=none"]
NVTX = [
    "--capture-range=nvtx",
    "--nvtx-capture=decode",
    "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0",
]


@pytest.mark.parametrize(
    ("kwargs", "middle"),
    [
        ({}, []),
        ({"capture_range": "nvtx", "nvtx_capture": "decode"}, NVTX),
        (
            {"capture_range": "nvtx", "nvtx_capture": "decode", "capture_range_end": "repeat:3"},
            [*NVTX, "--capture-range-end=repeat:3"],
        ),
        (
            {"capture_range": "cudaProfilerApi", "capture_range_end": "stop"},
            ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"],
        ),
    ],
)
@pytest.mark.parametrize("force", [True, False])
def test_nsys_profile_toggles(kwargs: dict, middle: list[str], force: bool) -> None:
    argv = nsys_profile_argv(APP, "out/trace", force_overwrite=force, **kwargs)
    tail = ["--output=out/trace", *(["--force-overwrite=true"] if force else []), *APP]
    assert argv == [*BASE, *middle, *tail]


def test_nsys_profile_trace_and_defaults_off() -> None:
    argv = nsys_profile_argv(
        APP, "t", trace=("cuda",), sample=None, cpuctxsw=None, cuda_graph_trace="node"
    )
    assert argv == [
        "nsys",
        "profile",
        "--trace=cuda",
        "--cuda-graph-trace=node",
        "--output=t",
        "--force-overwrite=true",
        *APP,
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"capture_range": "nvtx"}, "non-empty nvtx_capture"),
        ({"capture_range": "nvtx", "nvtx_capture": "  "}, "non-empty nvtx_capture"),
        ({"nvtx_capture": "decode"}, "capture_range='none'"),
        ({"capture_range_end": "stop"}, "needs a capture_range"),
        ({"capture_range": "nvtx", "nvtx_capture": "d", "capture_range_end": "often"}, "often"),
    ],
)
def test_nsys_profile_rejects(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        nsys_profile_argv(APP, "t", **kwargs)


def test_nsys_stats_argv_and_outputs() -> None:
    assert nsys_stats_argv("r.nsys-rep", "out/stats") == [
        "nsys", "stats",
        "--report", "cuda_gpu_kern_sum", "--report", "cuda_api_sum", "--report", "nvtx_sum",
        "--format", "csv", "--output", "out/stats",
        "--force-export=true", "--force-overwrite=true", "r.nsys-rep",
    ]  # fmt: skip
    assert nsys_stats_outputs("out/stats")["nvtx_sum"] == Path("out/stats_nvtx_sum.csv")


@pytest.mark.parametrize(
    ("kwargs", "middle"),
    [
        ({}, []),
        ({"nvtx_include": "decode"}, ["--nvtx", "--nvtx-include", "decode/"]),
        ({"nvtx_include": "decode/"}, ["--nvtx", "--nvtx-include", "decode/"]),
        ({"nvtx_include": "step", "nvtx_push_pop": False}, ["--nvtx", "--nvtx-include", "step"]),
        (
            {"kernel_regex": "gemv", "launch_skip": 1, "launch_count": 1},
            ["--kernel-name", "regex:gemv", "--launch-skip", "1", "--launch-count", "1"],
        ),
        (
            {"kernel_regex": "^k$", "kernel_name_base": "demangled"},
            ["--kernel-name-base", "demangled", "--kernel-name", "regex:^k$"],
        ),
    ],
)
def test_ncu_profile_toggles(kwargs: dict, middle: list[str]) -> None:
    argv = ncu_profile_argv(APP, "rep/k", preset="roofline", **kwargs)
    assert argv == [
        "ncu", "--target-processes", "all", *middle,
        "--section", "SpeedOfLight", "--section", "SpeedOfLight_RooflineChart",
        "--export", "rep/k", "--force-overwrite", *APP,
    ]  # fmt: skip


def test_ncu_presets_and_errors() -> None:
    full = ncu_profile_argv(APP, "r", preset="full", force_overwrite=False)
    assert full == ["ncu", "--target-processes", "all", "--set", "full", "--export", "r", *APP]
    overview = ncu_profile_argv(APP, "r")
    metrics = overview[overview.index("--metrics") + 1].split(",")
    assert "gpu__time_duration.sum" in metrics and overview.count("--section") == 5
    with pytest.raises(ValueError, match="range to include is empty"):
        ncu_profile_argv(APP, "r", nvtx_include="")
    with pytest.raises(ValueError, match="launch_count=0"):
        ncu_profile_argv(APP, "r", launch_count=0)


@pytest.mark.parametrize("page", ["details", "raw"])
def test_ncu_import(page: NcuPage) -> None:
    assert ncu_import_csv_argv("k.ncu-rep", page=page, sections=["Occupancy"]) == [
        "ncu", "--import", "k.ncu-rep", "--csv", "--page", page, "--section", "Occupancy",
    ]  # fmt: skip


def _rec(name: str, total_ms: float, calls: int) -> KernelRecord:
    return KernelRecord(name, None, total_ms, calls, total_ms / calls, None, 0.0, 0.0, None, 0.0)


def test_extract_top_kernels() -> None:
    records = [_rec("a", 1.0, 1), _rec("b", 5.0, 2), _rec("c", 5.0, 9), _rec("d", 2.0, 1)]
    assert [r.kernel_name for r in extract_top_kernels(records, 3)] == ["c", "b", "d"]
    assert len(extract_top_kernels(records, 10)) == 4
    with pytest.raises(ValueError, match="k must be >= 1"):
        extract_top_kernels(records, 0)


def test_top_kernels_cli(tmp_path: Path) -> None:
    src = SHARED_FIXTURES / "nsys" / "cuda_gpu_kern_sum.csv"
    out = tmp_path / "top_kernels.yaml"
    assert main([str(src), "-k", "3", "-o", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    top = parse_kernel_summary(src)[0]
    assert [k["rank"] for k in doc["kernels"]] == [1, 2, 3]
    assert doc["kernels"][0]["name"] == top.kernel_name
    assert doc["kernels"][0]["calls"] == 51_146
    # the module runs as a script too
    proc = subprocess.run(
        [sys.executable, "-m", "gpu_simulate_test.deep_profile.nsight.top_kernels", str(src),
         "-k", "2", "-o", str(tmp_path / "t2.yaml")],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert len(yaml.safe_load((tmp_path / "t2.yaml").read_text())["kernels"]) == 2


def test_find_tool(tmp_path: Path) -> None:
    assert find_tool("nsys", path=str(tmp_path)) is None
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert find_tool("ncu", path=str(tmp_path)) == str(fake)
    assert find_tool("ncu", path=os.pathsep.join([str(tmp_path / "none"), str(tmp_path)]))
    found, outcome = require_tool("nsys", "nsys_profile", path=str(tmp_path))
    assert found is None and outcome.status == "skipped" and "nsys not found" in outcome.reason


def test_step_outcome() -> None:
    assert StepOutcome.ok("stats").to_dict() == {"step": "stats", "status": "ok", "reason": ""}
    assert StepOutcome.skipped("ncu", "no GPU").status == "skipped"
    with pytest.raises(ValueError, match="gives no reason"):
        StepOutcome("ncu", "failed")
    with pytest.raises(ValueError, match="status='maybe'"):
        StepOutcome("ncu", "maybe", "x")  # type: ignore[arg-type]


def test_kernel_name_regex_matches_the_demangled_name_with_or_without_parameters() -> None:
    """Every kernel of the real nsys summary: its regex matches the name nsys printed, the same
    name with its parameters spelled otherwise or left out, and not another instantiation."""
    records = parse_kernel_summary(SHARED_FIXTURES / "nsys" / "cuda_gpu_kern_sum.csv")
    with_parameters = 0
    for rec in records:
        pattern = re.compile(kernel_name_regex(rec.kernel_name))
        assert pattern.fullmatch(rec.kernel_name), rec.kernel_name
        if rec.kernel_name.endswith(")"):
            with_parameters += 1
            bare = rec.kernel_name[: rec.kernel_name.rindex("(")]
            assert pattern.fullmatch(bare + "(int, float*)"), rec.kernel_name
        assert not pattern.fullmatch(rec.kernel_name.replace("<", "<int, ", 1) + "x")
    assert with_parameters >= 1  # the fixture has parameter lists to strip
    assert (
        kernel_name_regex("void k<int>(T1, (anonymous namespace)::T2)")
        == r"^void\ k<int>(\(.*\))?$"
    )


def test_top_kernels_cli_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([str(tmp_path / "missing.csv"), "-o", str(tmp_path / "t.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "missing.csv" in err and err.count("\n") == 1
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path / "missing.csv"), "-k", "0"])
    assert exc.value.code == 2 and "-k must be >= 1" in capsys.readouterr().err
    assert not (tmp_path / "t.yaml").exists()
