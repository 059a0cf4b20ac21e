"""What the compare stage writes into ``tmp/compare/<run_id>/``: its file names, plots and declared
tables (a sweep report writes the sweep files instead)."""

from __future__ import annotations

from gpu_simulate_test.io.artifacts import Column, TableSchema

COMPARISON_SCHEMA_VERSION = "1.0"

COMPARISON_PERCENTILES = TableSchema(
    name="comparison_percentiles",
    version=COMPARISON_SCHEMA_VERSION,
    description=(
        "Per metric and statistic: real and simulated values and the simulator's relative error "
        "(sim / real - 1; positive = simulated slower). Empty where a side lacks the metric."
    ),
    columns=(
        Column("metric", "str", "", "ttft, tpot, itl, e2e or scheduling_delay"),
        Column("stat", "str", "", "p50, p90, p95, p99 or mean"),
        Column("real_ms", "float", "ms", "measured value", nullable=True, min_value=0),
        Column("sim_ms", "float", "ms", "simulated value", nullable=True, min_value=0),
        Column("signed_rel_error", "float", "", "sim / real - 1", nullable=True),
        Column("abs_rel_error", "float", "", "|sim / real - 1|", nullable=True, min_value=0),
    ),
)

COMPARISON_REQUESTS = TableSchema(
    name="comparison_requests",
    version=COMPARISON_SCHEMA_VERSION,
    description="Requests ok on both sides, joined by request id, with per-request errors.",
    unique="request_id",
    columns=(
        Column("request_id", "int", "", "request index from the workload", min_value=0),
        Column("num_prefill_tokens", "int", "tokens", "prompt length", min_value=0),
        Column("num_decode_tokens", "int", "tokens", "output length", min_value=0),
        *(
            Column(f"{side}_{metric}_s", "float", "s", f"{side} {metric}", nullable=True)
            for metric in ("ttft", "tpot", "e2e", "scheduling_delay")
            for side in ("real", "sim")
        ),
        *(
            Column(f"{metric}_rel_error", "float", "", "sim / real - 1", nullable=True)
            for metric in ("ttft", "tpot", "e2e")
        ),
    ),
)

SWEEP_TABLE = TableSchema(
    name="comparison_sweep",
    version=COMPARISON_SCHEMA_VERSION,
    description="One row per compare run, metric and statistic of a sweep (latency vs load).",
    columns=(
        Column("compare_dir", "str", "", "the compare run"),
        Column("load", "float", "", "x axis value (offered QPS, batch cap or run index)"),
        Column("metric", "str", "", "ttft, tpot or e2e"),
        Column("stat", "str", "", "p50, p90, p99 or mean"),
        Column("real_ms", "float", "ms", "measured", nullable=True),
        Column("sim_ms", "float", "ms", "simulated", nullable=True),
        Column("signed_rel_error", "float", "", "sim / real - 1", nullable=True),
    ),
)

COMPARISON_STEPS = TableSchema(
    name="comparison_steps",
    version=COMPARISON_SCHEMA_VERSION,
    description=(
        "Engine steps by composition: how many the real engine and Vidur took, their median time "
        "and the simulator's relative error (both runs must have an engine_step_log)."
    ),
    unique="group",
    columns=(
        Column("group", "str", "", "decode-only steps by requests, prompt steps by tokens"),
        Column("real_steps", "int", "", "real engine steps in the group", min_value=0),
        Column("sim_steps", "int", "", "simulated batches in the group", min_value=0),
        Column(
            "real_median_ms",
            "float",
            "ms",
            "median real step cost (the engine's timed step plus its loop around it)",
            nullable=True,
        ),
        Column(
            "real_engine_median_ms",
            "float",
            "ms",
            "median of the engine's own step time (vLLM's iteration elapsed time)",
            nullable=True,
        ),
        Column("sim_median_ms", "float", "ms", "median simulated batch time", nullable=True),
        Column("rel_error", "float", "", "sim median / real median - 1", nullable=True),
    ),
)


COMPARISON_JSON = "comparison.json"
"""Every number of one comparison."""
SUMMARY_MD = "summary.md"
PERCENTILES_CSV = "percentiles.csv"
REQUESTS_CSV = "requests.csv"
STEPS_CSV = "steps.csv"
SWEEP_CSV = "sweep.csv"
SWEEP_JSON = "sweep.json"
SWEEP_MD = "sweep.md"
CDF_PLOT, SCATTER_PLOT, ERROR_PLOT = "cdf.png", "scatter.png", "error_by_length.png"
STEPS_PLOT = "steps.png"
ALIGNMENT_PLOT = "step_by_step.png"
"""Both step sequences over time, the first divergence marked (:mod:`.alignment`)."""
SWEEP_PLOT = "sweep_latency_vs_load.png"
TURN_PLOT = "ttft_by_turn.png"
"""A multi-turn workload's TTFT by turn, real vs simulated, per clock (:mod:`.multi_turn`)."""
TTFT_PARTS_PLOT = "ttft_parts.png"
"""Every real request's first token, hop by hop, in order of its TTFT (:mod:`.ttft_parts`;
the API server's hops or an in-process engine's own stamps)."""
