"""The host-memory probe: a real read of an LM head's bytes, and what compare makes of it."""

from __future__ import annotations

import os

import pytest

from gpu_simulate_test.calibration.record import SimulatedCalibration
from gpu_simulate_test.compare.calibration import host_memory, host_memory_markdown
from gpu_simulate_test.core.host import host_probe as hp


def test_a_reading_times_real_reads_on_the_core_it_names_and_restores_the_thread() -> None:
    import torch

    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    cpu = max(affinity)
    reading = hp.measure(8_000_000, 128, cpu, duration_s=0.05)
    assert reading["cpu"] == cpu and reading["reads"] >= 1
    assert reading["mbytes"] == pytest.approx(8.0, rel=1e-3)
    # 8 MB cannot be read faster than 1 TB/s nor slower than 50 MB/s on any CPU we run on
    assert 0.008 < reading["ms"] < 160 and reading["gb_s"] == pytest.approx(
        8.0 / reading["ms"], rel=1e-2
    )
    assert os.sched_getaffinity(0) == affinity and torch.get_num_threads() == threads


def test_the_probe_reads_one_lm_head_on_the_engines_core() -> None:
    assert hp.lm_head_bytes(151936, 128, "float32") == 151936 * 128 * 4  # tiny Qwen3: 78 MB
    assert hp.lm_head_bytes(151936, 1024, "bfloat16") == 151936 * 1024 * 2  # Qwen3-0.6B
    cpus = sorted(os.sched_getaffinity(0))
    assert hp.probe_cpu({cpus[0]}) == (cpus[1] if len(cpus) > 1 else cpus[0])
    assert hp.probe_cpu(None) == cpus[0]
    assert hp.reads_host("cpu", True)
    assert not hp.reads_host("cuda", True)  # a GPU's steps read the GPU's memory
    assert not hp.reads_host("cpu", False)  # backend.host_probe=false


def _run(before: float, after: float) -> dict[str, dict[str, float]]:
    return {
        "before": {"ms": before, "mbytes": 77.791, "cpu": 1},
        "after": {"ms": after, "mbytes": 77.791, "cpu": 1},
    }


def test_compare_sets_the_truths_reading_against_the_calibrations() -> None:
    calibration = hp.calibration_reading(_run(2.8, 3.2))
    assert calibration is not None and calibration["ms"] == pytest.approx(3.0)
    assert hp.calibration_reading({"before": {"ms": 2.8, "mbytes": 1.0}}) is None
    sim = SimulatedCalibration.from_run_meta({"calibration_host_probe": calibration})
    memory = host_memory(sim, {"host_probe": _run(5.0, 5.8)}, {"host_probe": _run(3.0, 3.0)})
    assert memory is not None
    assert memory["real"]["ratio"] == pytest.approx(5.4 / 3.0, rel=1e-3)
    assert memory["real_again"]["ratio"] == pytest.approx(1.0)
    text = host_memory_markdown(memory)
    assert "Host memory: the truth read 77.8 MB (one LM head) in 5.4 ms" in text
    assert "(1.80×, slower at the truth); at the repeat 1.00×" in text
    # nothing to set against: no calibration reading, no run reading, other bytes
    nothing = SimulatedCalibration.from_run_meta({})
    assert host_memory(nothing, {"host_probe": _run(3.0, 3.0)}) is None
    assert host_memory(sim, {}) is None
    other = SimulatedCalibration.from_run_meta(
        {"calibration_host_probe": {**calibration, "mbytes": 311.0}}
    )
    assert host_memory(other, {"host_probe": _run(3.0, 3.0)}) is None
    assert host_memory_markdown(None) == ""


def test_a_reading_that_rounds_to_one_says_neither_faster_nor_slower() -> None:
    same = {"mbytes": 77.791, "real_ms": 3.001, "calibration_ms": 3.0, "ratio": 1.0003}
    assert hp.line(same).endswith("(1.00×, the same)")
    assert hp.line({**same, "ratio": 0.8}).endswith("(0.80×, faster at the truth)")
