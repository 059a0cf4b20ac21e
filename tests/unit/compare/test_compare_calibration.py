"""The comparison says when its simulation could not reproduce its own engine calibration, and
when the profiled ops had to be scaled to fit it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_simulate_test.calibration.record import SimulatedCalibration
from gpu_simulate_test.compare.calibration import calibration_findings as findings_of


def calibration_findings(sim_meta: Mapping[str, Any]) -> list[str]:
    """The findings on a simulation's run_meta, read as compare reads it."""
    return findings_of(SimulatedCalibration.from_run_meta(sim_meta))


def fitted(**phases: tuple[float, float]) -> dict[str, object]:
    return {
        "calibration_error_by_phase": {
            phase: {"steps": 4, "abs_error_median": median, "abs_error_max": most}
            for phase, (median, most) in phases.items()
        }
    }


def test_an_unreproduced_kind_of_step_is_a_finding_and_a_fitted_one_is_not() -> None:
    meta = {"engine_overhead": fitted(decode=(0.0, 0.0), mixed=(0.11, 0.12), prefill=(0.05, 0.2))}
    (line,) = calibration_findings(meta)
    assert line.endswith(
        "mixed steps 11% off at the median, 12% at most (4 calibrated steps): a latency made "
        "mostly of such steps can be off by about as much"
    )  # not "no figure can be closer than that": the summary's own figures were closer
    assert calibration_findings({"engine_overhead": fitted(decode=(0.01, 0.03))}) == []


def test_scaled_ops_are_said_with_their_factors() -> None:
    meta = {"engine_overhead": {**fitted(decode=(0.0, 0.0)), "ops_scale": 1.0,
                                "prompt_ops_scale": 0.7712}}  # fmt: skip
    (line,) = calibration_findings(meta)
    assert "steps with a prompt × 0.77" in line and "decodes" not in line


def test_no_overhead_no_finding() -> None:
    assert calibration_findings({"engine_overhead": None}) == []
    assert calibration_findings({}) == []
