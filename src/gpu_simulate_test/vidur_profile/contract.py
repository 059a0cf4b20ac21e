"""What the vidur_profile stage writes: the profiling bundle under
``<profiling_root>/<hardware>/<model>/`` (read by vidur_simulate, so declared in the shared
:mod:`gpu_simulate_test.core.profiling.bundle`) and its own run in ``tmp/vidur_profile/<run_id>/``
(``run_meta.json`` only)."""

from __future__ import annotations

from gpu_simulate_test.core.profiling.bundle import (
    ATTENTION_TABLE,
    BUNDLE_SCHEMA_VERSION,
    ENGINE_STEPS_TABLE,
    MLP_TABLE,
    SERVING_STEPS_TABLE,
)
from gpu_simulate_test.io import layout

MLP_CSV = layout.MLP_PROFILE
ATTENTION_CSV = layout.ATTENTION_PROFILE
META_JSON = layout.BUNDLE_META
ENGINE_STEPS_CSV = layout.ENGINE_STEPS
"""The engine calibration's measured steps (with ``engine_overhead``)."""
SERVING_STEPS_CSV = layout.SERVING_STEPS
"""The calibration replays' recorded steps (a vLLM server that records its steps)."""
STEP_RESIDUALS_PNG = layout.STEP_RESIDUALS_PLOT
BUNDLE_FILES: tuple[str, ...] = (MLP_CSV, ATTENTION_CSV, META_JSON)

__all__ = (
    "ATTENTION_CSV",
    "ATTENTION_TABLE",
    "BUNDLE_FILES",
    "BUNDLE_SCHEMA_VERSION",
    "ENGINE_STEPS_CSV",
    "ENGINE_STEPS_TABLE",
    "META_JSON",
    "MLP_CSV",
    "MLP_TABLE",
    "SERVING_STEPS_CSV",
    "SERVING_STEPS_TABLE",
    "STEP_RESIDUALS_PNG",
)
