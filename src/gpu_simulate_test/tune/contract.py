"""What the tune stage writes into ``tmp/tune/<run_id>/``: one row per configuration
(``tune.csv``), the ranking, the recommendation and the real check (``tune.json``), the Pareto
plot (``tune.png``) and ``report.md``; the workload under ``runs/``, each configuration's Vidur
output per rate under ``points/<config_id>/``, each checked configuration's real runs and server
logs under ``runs/<config_id>/``."""

from __future__ import annotations

from gpu_simulate_test.io.artifacts import Column, TableSchema

TUNE_CSV = "tune.csv"
TUNE_JSON = "tune.json"
TUNE_PLOT = "tune.png"
REPORT_MD = "report.md"
POINTS_DIR = "points"
TUNE_SCHEMA_VERSION = "2.1"
"""2.0: ``num_gpu_blocks`` is ``num_gpu_blocks_override``, vLLM's name (one name per knob).
2.1: ``capacity_seed_low_qps`` / ``capacity_seed_high_qps``, the capacity's range over the
noise seeds (``tune.sim_seeds``), and ``tune.json`` ``sim_seeds``."""

TUNE_TABLE = TableSchema(
    name="tune",
    version=TUNE_SCHEMA_VERSION,
    description=(
        "One row per configuration of the tune's space, ranked (1: best): its vLLM knobs, its "
        "simulated capacity (or goodput at tune.qps), its latency at the shared rate and what "
        "limits it; measured columns where tune.verify ran it on the real engine."
    ),
    sorted_by="rank",
    columns=(
        Column("rank", "int", "", "1 is the best; invalid configurations last", min_value=1),
        Column("config_id", "str", "", "s<max_num_seqs>-t<max_num_batched_tokens>-..."),
        Column("configured", "bool", "", "the backend as configured (backend.*)"),
        Column("max_num_seqs", "int", "", "--max-num-seqs", min_value=1),
        Column("max_num_batched_tokens", "int", "tokens", "--max-num-batched-tokens", min_value=1),
        Column("enable_chunked_prefill", "bool", "", "--enable-chunked-prefill"),
        Column(
            "num_gpu_blocks_override", "int", "blocks", "--num-gpu-blocks-override", min_value=1
        ),
        Column("enable_prefix_caching", "bool", "", "--enable-prefix-caching"),
        Column(
            "replicas", "int", "GPUs", "engines, one GPU each (tune.space.replicas)", min_value=1
        ),
        Column(
            "router",
            "str",
            "",
            "what routes between the replicas (tune.space.router); empty for one",
            nullable=True,
        ),
        Column(
            "capacity_qps",
            "float",
            "req/s",
            "simulated: the highest rate that meets every goal (objective=capacity)",
            nullable=True,
            min_value=0,
        ),
        Column(
            "capacity_high_qps",
            "float",
            "req/s",
            "simulated: the lowest rate that missed a goal (the bracket's top)",
            nullable=True,
            min_value=0,
        ),
        Column(
            "capacity_seed_low_qps",
            "float",
            "req/s",
            "simulated: the lowest capacity over the noise seeds (tune.sim_seeds; capacity_qps "
            "is the median one's); empty with one seed",
            nullable=True,
            min_value=0,
        ),
        Column(
            "capacity_seed_high_qps",
            "float",
            "req/s",
            "simulated: the highest capacity over the noise seeds; empty with one seed",
            nullable=True,
            min_value=0,
        ),
        Column(
            "capacity_per_gpu_qps",
            "float",
            "req/s",
            "simulated: capacity_qps / replicas",
            nullable=True,
            min_value=0,
        ),
        Column(
            "rate_qps",
            "float",
            "req/s",
            "the shared rate the latency columns are read at: the configured backend's "
            "simulated capacity (objective=capacity) or tune.qps (goodput)",
            nullable=True,
            min_value=0,
        ),
        Column(
            "ttft_ms",
            "float",
            "ms",
            "TTFT at the goals' percentile, at rate_qps",
            nullable=True,
            min_value=0,
        ),
        Column(
            "tpot_ms",
            "float",
            "ms",
            "TPOT at the goals' percentile, at rate_qps",
            nullable=True,
            min_value=0,
        ),
        Column(
            "e2e_ms",
            "float",
            "ms",
            "E2E at the goals' percentile, at rate_qps",
            nullable=True,
            min_value=0,
        ),
        Column(
            "goodput_qps",
            "float",
            "req/s",
            "goodput at rate_qps (vllm bench serve --goodput with the goals)",
            nullable=True,
            min_value=0,
        ),
        Column(
            "binding",
            "str",
            "",
            "the goals the first rate above the capacity missed",
            nullable=True,
        ),
        Column("simulations", "int", "", "rates simulated", min_value=0),
        Column(
            "measured_qps",
            "float",
            "req/s",
            "tune.verify: the capacity measured on the real engine",
            nullable=True,
            min_value=0,
        ),
        Column(
            "measured_high_qps",
            "float",
            "req/s",
            "tune.verify: the lowest real rate that missed",
            nullable=True,
            min_value=0,
        ),
        Column(
            "invalid",
            "str",
            "",
            "why vLLM (or the bundle) refuses it; empty: it runs",
            nullable=True,
        ),
    ),
)
