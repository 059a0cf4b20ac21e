"""What a simulation with the serving terms says about them: the terms, which runs calibrated
them (the bundle's calibration replays, never the workload simulated), and the replays' steps
against Vidur's prediction (``serving_residuals.csv``, ``step_residuals.png``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from gpu_simulate_test.calibration import serving_load, serving_residuals
from gpu_simulate_test.calibration.record import CalibrationRecord
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import atomic_open
from gpu_simulate_test.vidur_simulate.simulator import SimulationResult

SERVING_RESIDUALS = "serving_residuals.csv"
"""Per calibration-replay step: its features, Vidur's prediction and the serving model's."""


def serving_report(
    result: SimulationResult,
    calibration: CalibrationRecord | None,
    steps: pd.DataFrame | None,
    plot: Path,
) -> dict[str, Any] | None:
    """The serving terms this simulation applied, fitted on the bundle's calibration replays
    (which runs calibrated them: the bundle's replays, never the workload simulated), and the
    replays' steps against Vidur's prediction of their composition (``step_residuals.png``)."""
    if result.serving_fit is None:
        return None
    load, features, predicted = result.serving_fit
    assert calibration is not None  # the serving terms are fitted on its replays
    calibrated_on = dict(calibration.serving or {})
    calibrated_on.pop("residuals", None)
    calibrated_on["bundle"] = str(calibration.bundle_path / layout.SERVING_STEPS)
    serving_residuals.plot_residuals(
        features,
        features["body_s"].to_numpy() / predicted,
        plot,
        "calibration replays: step time over Vidur's prediction (with the engine overhead)",
        "prediction",
    )
    table = features.drop(columns=["chunks"]).assign(
        predicted_s=predicted, modelled_s=serving_load.modelled_s(load, features, predicted)
    )
    with atomic_open(plot.with_name(SERVING_RESIDUALS)) as handle:
        table.to_csv(handle, index=False, lineterminator="\n")
    return serving_residuals.report(load, features, predicted, calibrated_on)
