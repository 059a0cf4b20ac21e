"""nsys stats and ncu CSV parsers against the real fixtures in tests/data and small written data."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from gpu_simulate_test.deep_profile.nsight.classify import classify_bound, roofline_points
from gpu_simulate_test.deep_profile.nsight.parsers import (
    NsightParseError,
    load_ncu_dir,
    parse_api_summary,
    parse_kernel_summary,
    parse_ncu_csv,
    parse_nvtx_summary,
    to_base_unit,
)
from gpu_simulate_test.deep_profile.nsight.plots import plot_roofline
from tests.conftest import SHARED_FIXTURES

KERN_SUM = SHARED_FIXTURES / "nsys" / "cuda_gpu_kern_sum.csv"
NCU = SHARED_FIXTURES / "ncu"
GEMV_DIR = NCU / "kernel_0001_67bdb7e29d1bb4e0ca0aec954ef18af3"
GEMM_DIR = NCU / "kernel_0003_0a7671622339a06b4a022feebfe90426"
DATA = Path(__file__).resolve().parents[2] / "data" / "nsight"
SOL = "GPU Speed Of Light Throughput"


def test_kernel_summary_reproduces_the_fixture_totals() -> None:
    records = parse_kernel_summary(KERN_SUM)
    assert len(records) == 128
    assert sum(r.total_ms for r in records) == pytest.approx(634.727919)
    assert sum(r.calls for r in records) == 254_999
    top = records[0]
    assert top.kernel_name.startswith("std::enable_if<!T7, void>::type internal::gemvx::kernel<")
    assert top.kernel_name.endswith(">>(T13)")  # the quoted name with commas kept whole
    assert (top.calls, top.total_ms, top.share_pct) == (51_146, pytest.approx(190.723047), 30.0)
    assert (top.mean_ms, top.median_ms) == (pytest.approx(0.003729), pytest.approx(0.003712))
    assert (top.min_ms, top.max_ms) == (pytest.approx(0.002143), pytest.approx(0.006592))
    assert top.device is None
    # the same numbers as an independent read of the file
    with KERN_SUM.open() as f:
        raw = list(csv.DictReader(f))
    assert [r.kernel_name for r in records] == [row["Name"] for row in raw]


def test_api_summary() -> None:
    records = parse_api_summary(DATA / "cuda_api_sum.csv")
    assert [r.api_name for r in records][:2] == ["cudaLaunchKernel", "cudaStreamSynchronize"]
    assert records[0].calls == 40_000
    assert records[0].total_ms == pytest.approx(1250.0)
    assert sum(r.share_pct for r in records) == pytest.approx(100.0)


def test_nvtx_summary_skips_nsys_preamble() -> None:
    records = parse_nvtx_summary(DATA / "nvtx_sum_stdout.txt")
    assert [(r.range_name, r.style, r.instances) for r in records] == [
        (":decode", "PushPop", 64),
        (":prefill", "PushPop", 8),
        ("warmup@gst", "StartEnd", 1),
    ]
    assert records[1].mean_ms == pytest.approx(35.0)


def test_summary_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,2\n")
    with pytest.raises(NsightParseError, match=r"bad\.csv: no 'Time \(%\)"):
        parse_kernel_summary(bad)
    no_name = tmp_path / "no_name.csv"
    no_name.write_text(
        "Time (%),Total Time (ns),Instances,Avg (ns),Min (ns),Max (ns)\n1,1,1,1,1,1\n"
    )
    with pytest.raises(NsightParseError, match=r"no_name\.csv: missing columns \['Name"):
        parse_kernel_summary(no_name)


@pytest.mark.parametrize(
    ("value", "unit", "expected", "base"),
    [
        (2.33, "Mbyte", 2_330_000.0, "byte"),
        (1.0, "KiB", 1024.0, "byte"),
        (13.72, "Ghz", 13.72e9, "Hz"),
        (6.75, "usecond", 6.75e-6, "s"),
        (6.75, "us", 6.75e-6, "s"),
        (4210, "nsecond", 4.21e-6, "s"),
        (345.14, "Gbyte/s", 345.14e9, "byte/s"),
        (19.66, "%", 19.66, "%"),
        (13485, "cycle", 13485, "cycle"),
        (128, "byte/cycle", 128, "byte/cycle"),
    ],
)
def test_units(value: float, unit: str, expected: float, base: str) -> None:
    got, got_base = to_base_unit(value, unit)
    assert got == pytest.approx(expected) and got_base == base


def test_ncu_metrics_with_units_and_separators() -> None:
    gemv = load_ncu_dir(GEMV_DIR)
    assert gemv.kernels[0].block_size == "(32, 4, 1)"
    cycles = gemv.metric("Elapsed Cycles", section=SOL)
    assert (cycles.raw_value, cycles.base_value) == ("13,485", 13_485.0)
    assert gemv.metric("SM Active Cycles", section=SOL).base_value == pytest.approx(9_495.42)
    read = gemv.metric("dram__bytes_read.sum")
    assert (read.unit, read.base_value, read.base_unit) == ("Mbyte", 2_330_000.0, "byte")
    assert gemv.metric("dram__bytes_write.sum").base_value == 0.0
    assert gemv.metric("Duration", section=SOL).base_value == pytest.approx(6.75e-6)
    assert gemv.metric("DRAM Frequency", section=SOL).base_value == pytest.approx(13.72e9)
    assert gemv.metric("flop_count_hp.sum").value is None  # "n/a"
    gemm = load_ncu_dir(GEMM_DIR)
    tensor = gemm.metric("sm__ops_path_tensor_src_bf16_dst_fp32.sum")
    assert tensor.base_value == 1_275_068_416
    mem = gemm.metric("Memory Throughput", section="Memory Workload Analysis")
    assert (mem.base_value, mem.base_unit) == (pytest.approx(143.20e9), "byte/s")
    rules = {r.rule_name: r for r in gemm.rules}
    assert rules["TheoreticalOccupancy"].estimated_speedup_pct == pytest.approx(38.17)
    assert rules["TheoreticalOccupancy"].speedup_type == "global"


def test_one_section_file_and_the_details_page_agree() -> None:
    section = parse_ncu_csv(GEMV_DIR / "ncu.section_SpeedOfLight.csv")
    details = parse_ncu_csv(GEMV_DIR / "ncu.details.csv")
    assert len(section.metrics) == 10
    for m in section.metrics:
        assert details.metric(m.metric_name, section=m.section).base_value == m.base_value


def test_raw_page() -> None:
    raw = parse_ncu_csv(DATA / "ncu_raw.csv")
    assert [k.kernel_id for k in raw.kernels] == [0, 1]
    read = raw.metric("dram__bytes_read.sum", kernel_id=0)
    assert read.base_value == pytest.approx(1_536_000.0)
    assert raw.metric("gpu__time_duration.sum", kernel_id=1).base_value == pytest.approx(18.944e-6)


def test_bound_classification_and_roofline(tmp_path: Path) -> None:
    reports = [load_ncu_dir(GEMV_DIR), load_ncu_dir(GEMM_DIR)]
    bounds = [b for r in reports for b in classify_bound(r)]
    # gemv: 19.66% memory vs 9.15% compute, both under 60%: ncu's SOLBottleneck says latency
    # ("grid too small"); cutlass gemm: 61.83% vs 41.49%, ncu: "Memory is more heavily utilized"
    assert [b.bound for b in bounds] == ["latency-bound", "memory-bound"]
    assert bounds[0].memory_throughput_pct == 19.66
    assert classify_bound(reports[1], margin_pct=25.0)[0].bound == "balanced"
    points = [p for r in reports for p in roofline_points(r)]
    gemv = points[0]
    assert gemv.peak_bytes_s == pytest.approx(128 * 13.72e9)
    assert gemv.peak_flop_s == pytest.approx(43_520 * 2.15e9)
    assert gemv.achieved_flop_s == pytest.approx((158.12 + 1.97) * 2.15e9)
    assert gemv.arithmetic_intensity < gemv.ridge_point and gemv.bound == "memory-bound"
    png = plot_roofline(points, tmp_path / "roofline.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no points"):
        plot_roofline([], tmp_path / "empty.png")
