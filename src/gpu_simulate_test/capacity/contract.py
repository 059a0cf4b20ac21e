"""What the capacity stage writes into ``tmp/capacity/<run_id>/``: the curve (``capacity.csv``,
one row per simulated rate), the answer (``capacity.json``), the plot and ``report.md``; the
workload it scaled and any real check under ``runs/``, Vidur's raw output per rate under
``points/``."""

from __future__ import annotations

from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import Column, TableSchema

CAPACITY_CSV = "capacity.csv"
CAPACITY_REAL_CSV = "capacity_real.csv"
"""The real engine's curve of ``capacity.verify=search`` (the ``capacity`` table)."""
CAPACITY_JSON = "capacity.json"
CAPACITY_PLOT = "capacity.png"
REPORT_MD = "report.md"
RUNS_DIR = layout.RUNS_DIR
POINTS_DIR = "points"
CAPACITY_SCHEMA_VERSION = "1.7"
"""1.2: ``capacity.json`` ``step_band`` (and ``verify.measured_in_band``); 1.3: its
``rate_unit`` (``req/s``, or ``sessions/s`` for a multi-turn workload) and ``sessions``, and the
table's optional per-rate columns of a multi-turn search; 1.4: the real search is seeded and sized
by time (``verify.seed``, ``plan``, ``stopped``, each run's ``requests``, ``arrivals_s`` and
``wall_s``; no ``requests_per_rate``), its rates' phases ``seed``, ``step``, ``bisect``; 1.5:
``fleet`` (``replicas``, ``router``: the fleet searched, ``fleet.*``); 1.6: ``sim_seeds`` (the
search under several noise seeds, ``capacity.sim_seeds``); 1.7: ``verify.bracket_narrow`` (a
search stopped before its bracket was narrow judges no ratio or band: ``measured_in_band`` null)."""
RATE_UNITS: tuple[str, ...] = ("req/s", "sessions/s")
"""``capacity.json`` ``rate_unit``: what ``qps`` counts (sessions/s: each session's turn 0)."""


def rate_axis(unit: str) -> str:
    """A plot's x label for a rate in ``unit`` (one of :data:`RATE_UNITS`)."""
    return "session rate (sessions/s)" if unit == RATE_UNITS[1] else f"request rate ({unit})"


CAPACITY_TABLE = TableSchema(
    name="capacity",
    version=CAPACITY_SCHEMA_VERSION,
    description=(
        "One row per simulated rate of a capacity search: the latency percentiles the "
        "simulation predicts and whether they meet the goals (`capacity.json` holds the goals, "
        "the answer and the rate's unit, `rate_unit`: req/s, or sessions/s for a multi-turn "
        "workload, whose search adds the optional columns)."
    ),
    sorted_by="qps",
    columns=(
        Column(
            "qps",
            "float",
            "req/s or sessions/s",
            "offered rate (the workload's arrivals, scaled); a multi-turn workload's in "
            "sessions/s (`rate_unit`: each session's turn 0 scaled, its later turns sent in their "
            "closed loop)",
            min_value=0,
        ),
        Column(
            "phase",
            "str",
            "",
            "grid or refine (the simulated search); seed, step or bisect (the real search's rates, "
            "`capacity_real.csv`)",
            allowed=("grid", "refine", "seed", "step", "bisect"),
        ),
        Column("meets_slo", "bool", "", "every goal met"),
        Column("ttft_p50_ms", "float", "ms", "TTFT p50", nullable=True, min_value=0),
        Column("ttft_p90_ms", "float", "ms", "TTFT p90", nullable=True, min_value=0),
        Column("ttft_p95_ms", "float", "ms", "TTFT p95", nullable=True, min_value=0),
        Column("ttft_p99_ms", "float", "ms", "TTFT p99", nullable=True, min_value=0),
        Column("tpot_p50_ms", "float", "ms", "TPOT p50", nullable=True, min_value=0),
        Column("tpot_p90_ms", "float", "ms", "TPOT p90", nullable=True, min_value=0),
        Column("tpot_p95_ms", "float", "ms", "TPOT p95", nullable=True, min_value=0),
        Column("tpot_p99_ms", "float", "ms", "TPOT p99", nullable=True, min_value=0),
        Column("e2e_p50_ms", "float", "ms", "E2E p50", nullable=True, min_value=0),
        Column("e2e_p90_ms", "float", "ms", "E2E p90", nullable=True, min_value=0),
        Column("e2e_p95_ms", "float", "ms", "E2E p95", nullable=True, min_value=0),
        Column("e2e_p99_ms", "float", "ms", "E2E p99", nullable=True, min_value=0),
        Column(
            "goodput_qps",
            "float",
            "req/s",
            "requests that met every goal per request, per second (vllm bench serve --goodput "
            "with the goals' values)",
            nullable=True,
            min_value=0,
        ),
        Column("sim_wall_s", "float", "s", "wall time of the simulation", min_value=0),
    ),
    optional=(
        Column(
            "request_rate_per_s",
            "float",
            "req/s",
            "requests finished per second, first send to last token (a multi-turn search)",
            nullable=True,
            min_value=0,
        ),
        Column(
            "mean_session_s",
            "float",
            "s",
            "mean of each session's turn 0 send to its last turn's last token (multi-turn)",
            nullable=True,
            min_value=0,
        ),
        Column(
            "concurrent_users",
            "float",
            "",
            "sessions open at once on average: qps x mean_session_s, Little's law (multi-turn)",
            nullable=True,
            min_value=0,
        ),
    ),
)
