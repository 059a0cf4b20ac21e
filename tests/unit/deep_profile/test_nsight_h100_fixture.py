"""The parsers on real ncu output captured by the deep_profile stage on an H100 (Qwen3-0.6B decode).

`tests/data/ncu_h100/` holds `ncu --csv --page details` of 20 kernel launches inside the NVTX
range `decode/` (command in command.json), made 2026-11-22: NVIDIA H100 80GB HBM3, driver
580.159.04, ncu 2025.3.1, torch 2.11.0+cu130.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_simulate_test.deep_profile.nsight.classify import classify_bound
from gpu_simulate_test.deep_profile.nsight.parsers import parse_ncu_csv

DATA = Path(__file__).resolve().parents[2] / "data" / "ncu_h100"


def test_h100_details_parse_into_twenty_sm90_kernels() -> None:
    report = parse_ncu_csv(DATA / "ncu_details.csv")
    assert len(report.kernels) == 20
    assert {k.compute_capability for k in report.kernels} == {"9.0"}
    assert report.kernels[0].kernel_name.startswith(
        "void unnamed>::indexSelectSmallIndex<c10::BFloat16"
    )
    dram_read = report.metric("dram__bytes_read.sum", kernel_id=0)
    assert (dram_read.unit, dram_read.raw_value, dram_read.base_value) == ("Kbyte", "6.66", 6660.0)


def test_h100_kernels_are_classified_and_the_command_was_nvtx_gated() -> None:
    bounds = classify_bound(parse_ncu_csv(DATA / "ncu_details.csv"))
    assert len(bounds) == 20
    # every decode kernel at most 13 % of peak on either unit: ncu's SOLBottleneck rule (in
    # the file) says latency or a grid too small for every one; not memory-bound or balanced
    assert {b.bound for b in bounds} == {"latency-bound"}
    assert max(max(b.compute_throughput_pct, b.memory_throughput_pct) for b in bounds) < 13.1
    argv = json.loads((DATA / "command.json").read_text())["argv"]
    assert argv[argv.index("--nvtx-include") + 1] == "decode/"
    assert "--nvtx" in argv and argv[argv.index("--launch-count") + 1] == "20"


@pytest.mark.parametrize("kernel_id", [0, 19])
def test_every_kernel_has_a_duration(kernel_id: int) -> None:
    report = parse_ncu_csv(DATA / "ncu_details.csv")
    duration = report.metric("gpu__time_duration.sum", kernel_id=kernel_id)
    assert duration.base_unit == "s" and duration.base_value is not None
    assert 0 < duration.base_value < 1e-3
