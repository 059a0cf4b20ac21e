"""What the simulation's engine-overhead fit says about the calibration it was built on.

A simulated step is Vidur's ops plus the fitted overhead (:mod:`~.calibration.overhead`).
Where that sum cannot reproduce the calibrated steps, no comparison can be closer than the gap,
and where the profiled ops had to be scaled down to fit, the user should know the layer profile
was off. Both are read from what the simulation says of its calibration
(:class:`~gpu_simulate_test.calibration.record.SimulatedCalibration`: its ``run_meta.json``
``engine_overhead``) and said as findings of the comparison, so that neither stays silent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_simulate_test.calibration.record import SimulatedCalibration
from gpu_simulate_test.core.host import host_probe

UNREPRODUCED = 0.05
"""A kind of calibrated step whose simulated time is this far off at the median is a finding."""


def calibration_findings(used: SimulatedCalibration) -> list[str]:
    """Findings on the overhead fit a simulation recorded (none without an overhead)."""
    fitted = used.engine_overhead
    if fitted is None:
        return []
    lines = []
    by_phase = fitted.get("calibration_error_by_phase") or {}
    for phase, stats in sorted(by_phase.items()):
        if not isinstance(stats, Mapping) or stats.get("abs_error_median", 0.0) <= UNREPRODUCED:
            continue
        lines.append(
            f"the simulation does not reproduce its own engine calibration: {phase} steps "
            f"{stats['abs_error_median']:.0%} off at the median, {stats['abs_error_max']:.0%} at "
            f"most ({stats['steps']} calibrated steps): a latency made mostly of such steps "
            "can be off by about as much"
        )
    scales = [
        (kind, float(fitted.get(key, 1.0)))
        for kind, key in (("decodes", "ops_scale"), ("steps with a prompt", "prompt_ops_scale"))
    ]
    scaled = [f"{kind} × {value:.2f}" for kind, value in scales if value != 1.0]
    if scaled:
        lines.append(
            "the engine ran faster than Vidur's profiled ops add up to (CUDA graphs, or a layer "
            "profile taken at another speed): ops scaled to fit its calibration, "
            + ", ".join(scaled)
        )
    return lines


def host_memory(
    used: SimulatedCalibration,
    real_meta: Mapping[str, Any],
    repeat_meta: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The real run's host reading (and its repeat's) against the calibration's
    (:func:`gpu_simulate_test.core.host.host_probe.drift`); None when the calibration or the real
    run read none."""
    calibration = used.host_probe
    real = host_probe.drift(calibration, real_meta.get("host_probe"))
    if real is None:
        return None
    again = None if repeat_meta is None else repeat_meta.get("host_probe")
    return {"real": real, "real_again": host_probe.drift(calibration, again)}


def host_memory_markdown(memory: Mapping[str, Any] | None) -> str:
    """The summary's paragraph on :func:`host_memory` (empty without it)."""
    if memory is None:
        return ""
    said = host_probe.line(memory["real"])
    text = f"\n{said[0].upper()}{said[1:]}"
    if memory.get("real_again") is not None:
        text += f"; at the repeat {memory['real_again']['ratio']:.2f}×"
    return text + (
        " (`host_memory`: each run reads it before its clock starts and after its last request, "
        "the calibration before its experiments and after its replays).\n"
    )
