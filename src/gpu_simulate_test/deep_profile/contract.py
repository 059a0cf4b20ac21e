"""Every file name of a deep_profile run, and the tables it writes (declared, versioned)."""

from __future__ import annotations

from gpu_simulate_test.io.artifacts import Column, TableSchema

# run root
ENV = "env.json"
CONFIG = "config.yaml"
INPUTS = "inputs.yaml"
STEPS = "steps.json"
REPORT = "report.md"
STAKEHOLDER_SUMMARY = "stakeholder_summary.md"

# step folders, in run order
STATIC_DIR = "static_analysis"
TORCH_DIR = "torch_profiler"
RUN_WORKLOAD_DIR = "run_workload"
NSYS_DIR = "nsys"
NCU_DIR = "ncu"

# static_analysis/
STATIC_STEPS_CSV = "step_costs.csv"
STATIC_LAYER_CSV = "layer_ops.csv"
STATIC_JSON = "static_analysis.json"
STATIC_MD = "static_analysis.md"

# torch_profiler/
OPERATORS_CSV = "operators.csv"
OPERATORS_MD = "operators.md"
METRICS = "metrics.json"
TRACE = "trace.json"
STEP_TIMINGS_CSV = "step_timings.csv"

# run_workload/
WORKLOAD_TIMINGS = "timings.json"

# nsys/ and ncu/
COMMAND = "command.json"
"""The argv that runs (or would run) the profiler, its environment and the app's argv."""
NSYS_REPORT_STEM = "profile"
NSYS_STATS_PREFIX = "stats"
NSYS_KERNELS_JSON = "kernels.json"
"""Every kernel of nsys's ``cuda_gpu_kern_sum`` report: ``{"kernels": [...]}``."""
NCU_REPORT_STEM = "kernels"
NCU_DETAILS_CSV = "ncu_details.csv"
NCU_BOUNDS_JSON = "kernel_bounds.json"
"""Every profiled kernel with its bound label: ``{"kernels": [...]}``."""
LOG = "log.txt"

OPERATORS = TableSchema(
    name="deep_profile_operators",
    version="1.0",
    description="torch.profiler key_averages(): one row per operator, sorted by the sort key.",
    unique="operator",
    columns=(
        Column("operator", "str", description="aten op or record_function name"),
        Column("calls", "int", min_value=0),
        Column("self_cpu_time_ms", "float", "ms", min_value=0),
        Column("cpu_total_time_ms", "float", "ms", min_value=0),
        Column("self_device_time_ms", "float", "ms", min_value=0),
        Column("device_total_time_ms", "float", "ms", min_value=0),
        Column("self_cpu_share_pct", "float", "%", min_value=0),
        Column("self_device_share_pct", "float", "%", min_value=0),
    ),
)

STEP_TIMINGS = TableSchema(
    name="deep_profile_step_timings",
    version="1.0",
    description="Wall time of every forward step of the timed pass (synchronized on CUDA).",
    columns=(
        Column("request_id", "int", min_value=0),
        Column("phase", "str", description="prefill or decode"),
        Column("new_tokens", "int", min_value=1),
        Column("cached_tokens", "int", min_value=0),
        Column("duration_s", "float", "s", min_value=0),
        Column("flops", "int", "FLOP", min_value=0),
        Column("bytes_moved", "int", "B", min_value=0),
    ),
)

STEP_COSTS = TableSchema(
    name="deep_profile_step_costs",
    version="1.0",
    description="static_analysis.cost_table rows: one per (phase, length, batch).",
    columns=(
        Column("phase", "str"),
        Column("batch_size", "int", min_value=1),
        Column("new_tokens", "int", min_value=1),
        Column("cached_tokens", "int", min_value=0),
        Column("flops", "int", "FLOP", min_value=0),
        Column("bytes_moved", "int", "B", min_value=0),
        Column("arithmetic_intensity_flop_per_byte", "float", "FLOP/B", min_value=0),
        Column("compute_time_s", "float", "s", min_value=0),
        Column("memory_time_s", "float", "s", min_value=0),
        Column("bound_time_s", "float", "s", min_value=0),
        Column("bound", "str", description="compute or memory"),
    ),
)

LAYER_OPS = TableSchema(
    name="deep_profile_layer_ops",
    version="1.0",
    description="Per-op cost of one decoder layer (and the outer ops) for one step shape.",
    columns=(
        Column("phase", "str"),
        Column("new_tokens", "int", min_value=1),
        Column("cached_tokens", "int", min_value=0),
        Column("scope", "str", description="layer (one decoder layer) or model (outer ops)"),
        Column("op", "str"),
        Column("kind", "str"),
        Column("params", "int", min_value=0),
        Column("flops", "int", "FLOP", min_value=0),
        Column("bytes_moved", "int", "B", min_value=0),
    ),
)
