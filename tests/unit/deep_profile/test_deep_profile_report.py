"""report.md's wording against the run's own numbers: the peak MFU is taken against, and the
parameter breakdown adding up to the total."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpu_simulate_test.config.presets import model_preset
from gpu_simulate_test.deep_profile.nsight.tools import StepOutcome
from gpu_simulate_test.deep_profile.peaks import flop_peak_basis
from gpu_simulate_test.deep_profile.report import stage_report, static_markdown
from gpu_simulate_test.deep_profile.static_analysis import parameter_counts


def _torch_metrics(peaks: dict[str, Any]) -> dict[str, Any]:
    return {
        "hardware": {"name": "cpu", "peak_bf16_tflops": 0.4, "peaks": peaks},
        "phases": {},
        "sort_key": "self_cpu_time_ms",
        "top_operators": [],
        "notes": [],
    }


MEASURED = {"source": "measured", "peak_tflops": 0.4, "memory_bandwidth_gb_s": 20.0}


@pytest.mark.parametrize(
    ("peaks", "said", "not_said"),
    [
        (MEASURED, "fp32 matmul rate measured on this host", "bf16"),
        ({"source": "config"}, "dense bf16 peak from the hardware config", "fp32"),
    ],
)
def test_mfu_names_the_peak_it_was_taken_against(
    peaks: dict[str, Any], said: str, not_said: str
) -> None:
    text = stage_report("t", [StepOutcome.ok("torch_profiler")], None, _torch_metrics(peaks), {})
    mfu = next(line for line in text.splitlines() if line.startswith("MFU = "))
    assert said in mfu and not_said not in mfu
    assert flop_peak_basis(peaks) == said


def test_mfu_wording_prefers_the_basis_metrics_json_records() -> None:
    metrics = _torch_metrics(MEASURED)
    metrics["hardware"]["peak_tflops_basis"] = "some recorded peak"
    text = stage_report("t", [], None, metrics, {})
    assert "MFU = analytic FLOPs ÷ (time × some recorded peak)" in text


def test_parameter_breakdown_adds_up_to_the_total() -> None:
    params = parameter_counts(model_preset("qwen3_tiny")).to_dict()
    assert params["final_norm"] > 0  # the part the breakdown used to leave out
    doc = {
        "model": "qwen3_tiny",
        "hardware": "cpu",
        "dtype": "fp32",
        "parameters": params,
        "kv_cache_bytes_per_token": 1,
        "steps": [],
    }
    line = next(s for s in static_markdown(doc).splitlines() if s.startswith("- parameters:"))
    total, per_layer, layers, *parts = (
        int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", line)
    )
    assert total == params["total"] and "final norm" in line
    assert per_layer * layers + sum(parts) == total
