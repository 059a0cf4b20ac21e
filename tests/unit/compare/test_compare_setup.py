"""The summary's setup table: what each side ran on, as its run recorded it."""

from __future__ import annotations

from gpu_simulate_test.compare.report import _setup_section


def test_an_imported_truth_s_setup_does_not_show_the_importing_machine() -> None:
    """An H100 `vllm bench serve` file imported on a laptop showed the laptop's CPU and torch
    as the real run's device and versions."""
    real = {"run_dir": "tmp/real_bench/gl", "model": "qwen3_tiny", "hardware": "cpu",
            "device": None, "device_name": "AMD EPYC", "torch": "2.13.0+cpu",
            "transformers": "5.19.0", "backend": "guidellm", "imported": True}  # fmt: skip
    sim = {"run_dir": "tmp/vidur_simulate/gl", "model": "qwen3_tiny", "hardware": "cpu"}
    text = "\n".join(_setup_section({"real": real, "sim": sim}))
    assert "| device | not recorded (guidellm) |" in text
    assert "| versions | not recorded (guidellm) |" in text
    assert "AMD EPYC" not in text and "2.13.0+cpu" not in text
    ours = "\n".join(_setup_section({"real": {**real, "imported": False}, "sim": sim}))
    assert "cpu (None, AMD EPYC)" in ours and "torch 2.13.0+cpu" in ours
