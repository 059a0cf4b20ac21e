"""What the real_bench stage writes into ``tmp/real_bench/<run_id>/``: the request and token
metrics and the engine's step log (shared with vidur_simulate and compare, so declared in
:mod:`gpu_simulate_test.io.schemas`), ``summary.json`` (``vllm bench serve``'s keys) and, with a
GPU, ``telemetry.csv``."""

from __future__ import annotations

from gpu_simulate_test.core.engines.vllm import SERVER_METRICS as SERVER_METRICS_JSON
from gpu_simulate_test.io import layout, schemas
from gpu_simulate_test.io.artifacts import Column, TableSchema

REQUEST_METRICS_CSV = layout.REQUEST_METRICS
ENGINE_STEP_LOG_CSV = layout.ENGINE_STEP_LOG
REQUEST_METRICS_TABLE = schemas.REQUEST_METRICS
ENGINE_STEP_LOG_TABLE = schemas.ENGINE_STEP_LOG
SUMMARY = "summary.json"
TELEMETRY_CSV = "telemetry.csv"
SERVER_METRICS = SERVER_METRICS_JSON
"""vLLM's Prometheus counters before and after the run (vllm backend)."""

TELEMETRY = TableSchema(
    name="telemetry",
    version="1.0",
    description="GPU telemetry sampled through NVML during a real run.",
    sorted_by="time_s",
    columns=(
        Column("time_s", "float", "s", "sample time from run start (negative: before it)"),
        Column("gpu_index", "int", "", "NVML device index", min_value=0),
        Column("sm_clock_mhz", "float", "MHz", "SM clock", nullable=True, min_value=0),
        Column("mem_clock_mhz", "float", "MHz", "memory clock", nullable=True, min_value=0),
        Column("power_w", "float", "W", "board power draw", nullable=True, min_value=0),
        Column("memory_used_bytes", "float", "bytes", "device memory used", nullable=True),
        Column("gpu_util_pct", "float", "%", "GPU utilization", nullable=True, min_value=0),
        Column("mem_util_pct", "float", "%", "memory-controller utilization", nullable=True),
        Column("temperature_c", "float", "°C", "GPU temperature", nullable=True),
    ),
)
