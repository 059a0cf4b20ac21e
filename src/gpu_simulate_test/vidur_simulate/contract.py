"""What the vidur_simulate stage writes into ``tmp/vidur_simulate/<run_id>/``:
``request_metrics.csv`` in the real bench's schema (shared: :mod:`gpu_simulate_test.io.schemas`),
the engine step log of Vidur's batches, and Vidur's own output under ``vidur/``."""

from __future__ import annotations

from gpu_simulate_test.io import layout, schemas

REQUEST_METRICS_CSV = layout.REQUEST_METRICS
ENGINE_STEP_LOG_CSV = layout.ENGINE_STEP_LOG
REQUEST_METRICS_TABLE = schemas.REQUEST_METRICS
ENGINE_STEP_LOG_TABLE = schemas.ENGINE_STEP_LOG
VIDUR_DIR = "vidur"
"""Vidur's raw output (its own metrics and config), as Vidur writes it."""
TRACE_FILE = "trace.csv"
"""The request trace handed to Vidur (its ``trace_replay`` format), inside ``vidur/``."""
VIDUR_REQUEST_METRICS = "request_metrics.csv"
"""Vidur's per-request metrics, inside its output folder."""
ENGINE_OVERHEAD_FIT = "engine_overhead_fit.csv"
"""The calibrated engine overhead the simulation added, per step kind."""
