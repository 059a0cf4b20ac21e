"""MFU/MBU, phase aggregation and serving numbers of deep_profile on hand-computed values."""

from __future__ import annotations

import math

import pytest

from gpu_simulate_test.config.schema import HardwareConfig
from gpu_simulate_test.deep_profile.metrics import (
    StepTiming,
    phase_metrics,
    serving_summary,
    utilization,
)
from gpu_simulate_test.deep_profile.torch_prof import (
    operator_rows,
    resolve_activities,
    sort_key,
    top_operators,
)

# 100 TFLOP/s dense, 1000 GB/s: ridge point 100 FLOP/B
HW = HardwareConfig(name="toy", peak_bf16_tflops=100.0, memory_bandwidth_gb_s=1000.0, memory_gib=1)


def test_utilization_on_round_numbers() -> None:
    # 10 TFLOP and 200 GB in 1 s: 10 TFLOP/s of 100 → 10 %, 200 GB/s of 1000 → 20 %
    util = utilization(10e12, 200e9, 1.0, HW)
    assert util["mfu"] == pytest.approx(0.10)
    assert util["mbu"] == pytest.approx(0.20)
    assert util["achieved_tflops"] == pytest.approx(10.0)
    assert util["achieved_gb_s"] == pytest.approx(200.0)
    with pytest.raises(ValueError, match="time_s"):
        utilization(1, 1, 0.0, HW)


def test_phase_metrics_sums_steps_and_bounds_each_step() -> None:
    steps = [
        # decode: 2 GB each at 1000 GB/s → 2 ms roofline; ran 4 ms → 50 %
        StepTiming(0, "decode", 1, 10, 0.004, 2_000_000_000, 2_000_000_000),
        StepTiming(0, "decode", 1, 11, 0.004, 2_000_000_000, 2_000_000_000),
        # prefill: 1 TFLOP at 100 TFLOP/s → 10 ms (compute-bound, 1 GB → 1 ms); ran 20 ms
        StepTiming(0, "prefill", 10, 0, 0.020, 1_000_000_000_000, 1_000_000_000),
    ]
    decode = phase_metrics(steps, "decode", HW)
    assert decode is not None
    assert decode.num_steps == 2 and decode.tokens == 2
    assert decode.time_s == pytest.approx(0.008)
    assert decode.mbu == pytest.approx(4e9 / 0.008 / 1e12)  # 0.5
    assert decode.mfu == pytest.approx(4e9 / 0.008 / 1e14)  # 0.005
    assert decode.roofline_bound_time_s == pytest.approx(0.004)
    assert decode.roofline_efficiency == pytest.approx(0.5)
    assert decode.bound == "memory"
    assert decode.mean_step_ms == pytest.approx(4.0)
    prefill = phase_metrics(steps, "prefill", HW)
    assert prefill is not None and prefill.bound == "compute"
    assert prefill.mfu == pytest.approx(0.5)
    assert prefill.roofline_efficiency == pytest.approx(0.5)
    assert phase_metrics(steps, "other", HW) is None


def test_serving_summary_ttft_tpot_throughput() -> None:
    steps = [
        StepTiming(0, "prefill", 8, 0, 0.1, 1, 1),
        StepTiming(0, "decode", 1, 8, 0.01, 1, 1),
        StepTiming(0, "decode", 1, 9, 0.03, 1, 1),
        StepTiming(1, "prefill", 4, 0, 0.3, 1, 1),  # one output token: no decode step
    ]
    s = serving_summary(steps)
    assert s["num_requests"] == 2
    assert s["output_tokens"] == 4  # 2 first tokens + 2 decode steps
    assert s["prompt_tokens"] == 12
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["mean_tpot_ms"] == pytest.approx(20.0)  # only request 0 has decode steps
    assert s["output_throughput_tokens_per_s"] == pytest.approx(4 / 0.44)
    assert math.isnan(serving_summary([StepTiming(0, "prefill", 1, 0, 1.0, 1, 1)])["mean_tpot_ms"])


class _Event:
    def __init__(
        self,
        key: str,
        count: int,
        self_cpu: float,
        self_dev: float,
        annotation: bool = False,
        dev_total: float | None = None,
    ) -> None:
        self.key, self.count = key, count
        self.self_cpu_time_total, self.cpu_time_total = self_cpu, self_cpu * 2
        self.self_device_time_total = self_dev
        self.device_time_total = self_dev if dev_total is None else dev_total
        self.is_user_annotation = annotation


def test_operator_rows_convert_us_to_ms_and_shares_add_up() -> None:
    rows = operator_rows(
        [_Event("aten::mm", 10, 3000.0, 900.0), _Event("aten::add", 5, 1000.0, 100.0)]
    )
    mm = rows[0]
    assert mm["self_cpu_time_ms"] == pytest.approx(3.0)
    assert mm["cpu_total_time_ms"] == pytest.approx(6.0)
    assert mm["self_cpu_share_pct"] == pytest.approx(75.0)
    assert mm["self_device_share_pct"] == pytest.approx(90.0)
    assert sum(r["self_cpu_share_pct"] for r in rows) == pytest.approx(100.0)
    top = top_operators(rows, "self_device_time_ms", 1)
    assert [r["operator"] for r in top] == ["aten::mm"]


def test_a_range_seen_on_cpu_and_gpu_is_one_row_without_double_counting() -> None:
    # seen on an H100: record_function("decode") comes back as a CPU event (whose kernels sum to
    # 400 us) and a GPU annotation whose "self" device time is its 500 us span; the kernels
    # inside are their own rows
    rows = operator_rows(
        [
            _Event("decode", 4, 2000.0, 0.0, annotation=True, dev_total=400.0),
            _Event("decode", 4, 0.0, 500.0, annotation=True),
            _Event("aten::mm", 8, 300.0, 300.0),
            _Event("aten::add", 8, 100.0, 100.0),
        ]
    )
    by_name = {r["operator"]: r for r in rows}
    assert len(rows) == 3
    decode = by_name["decode"]
    assert decode["calls"] == 4
    assert decode["self_cpu_time_ms"] == pytest.approx(2.0)
    assert decode["self_device_time_ms"] == 0  # the kernels' time is theirs, not the range's
    assert decode["device_total_time_ms"] == pytest.approx(0.5)  # the range's span
    assert by_name["aten::mm"]["self_device_share_pct"] == pytest.approx(75.0)
    assert sum(r["self_device_share_pct"] for r in rows) == pytest.approx(100.0)


def test_activities_and_sort_key_follow_the_device() -> None:
    chosen, notes = resolve_activities(("cpu", "cuda"), "cpu", cuda_available=False)
    assert chosen == ["cpu"] and "hardware.device=cpu" in notes[0]
    chosen, notes = resolve_activities(("cuda",), "cuda", cuda_available=False)
    assert chosen == ["cpu"] and "torch.cuda.is_available() is False" in notes[0]
    chosen, notes = resolve_activities(("cpu", "cuda"), "cuda:0", cuda_available=True)
    assert chosen == ["cpu", "cuda"] and not notes
    assert sort_key("auto", ["cpu", "cuda"]) == "self_device_time_ms"
    assert sort_key("auto", ["cpu"]) == "self_cpu_time_ms"
    assert sort_key("cpu", ["cpu", "cuda"]) == "self_cpu_time_ms"
