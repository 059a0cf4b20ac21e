"""What a fidelity run writes: its file names and the declared error table.

``tmp/fidelity/<run_id>/`` holds ``run_meta.json``, the manifest of its real phase, ``runs/``
(every stage run of the campaign: ``runs/<stage>/<backend>-load<i>``, the capacity probe
``runs/real_bench/<backend>-capacity``, repeats ``...-load<i>-r<k>``), ``profiles/`` (bundles the
campaign made for itself), and the report: ``fidelity.json``, ``fidelity.csv``, ``report.md`` and
``latency-vs-load-<backend>.png``. A multirun's combined report lands in
``tmp/fidelity/<run_id>-combined/`` (``combined.json``, ``fidelity.csv``, ``report.md``).
"""

from __future__ import annotations

from gpu_simulate_test.fidelity.manifest import MANIFEST_FILE
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import Column, TableSchema

FIDELITY_JSON = "fidelity.json"
FIDELITY_CSV = "fidelity.csv"
REPORT_MD = "report.md"
SUMMARY_MD = "summary.md"
COMBINED_JSON = "combined.json"
RUNS_DIR = layout.RUNS_DIR
"""Stage runs of the campaign, ``runs/<stage>/<run_id>``: the directory is self-contained."""
PROFILES_DIR = "profiles"
COMBINED_SUFFIX = "combined"
FIDELITY_SCHEMA_VERSION = "1.3"
"""Of ``fidelity.json`` and ``fidelity.csv`` (the argparse harness's reports had none); 1.1 adds
the ``clock`` column (the engine's own clock beside the client's) and the loads' ``window``; 1.2
adds ``mean_signed_error_pct`` to every spread in ``fidelity.json`` (the simulation's and the
noise floor's); 1.3 each load simulated again at its real run's own step level
(``sim_at_level_ms``, ``rel_error_at_level``, ``fidelity.json`` ``at_real_step_level``)."""

__all__ = ("MANIFEST_FILE",)


def plot_name(backend: str) -> str:
    return f"latency-vs-load-{backend}.png"


FIDELITY_TABLE = TableSchema(
    name="fidelity",
    version=FIDELITY_SCHEMA_VERSION,
    description=(
        "The fidelity stage's error table (`fidelity.csv`, the same rows as `fidelity.json` "
        "`rows`): per backend, load, metric and percentile, real against simulated. With "
        "`fidelity.real_repeats` >= 2 two more columns follow: `real_repeat_ms` (the repeat "
        "furthest from the first real run) and `noise` (repeat / real - 1, the noise floor). Where "
        "the real runs recorded their steps (a started vLLM server), two more: "
        "`sim_at_level_ms` (the load simulated again with every step's time times the factor its "
        "real run's steps took against the step model) and `rel_error_at_level` (that / real - 1)."
    ),
    columns=(
        Column("backend", "str", "", "the real engine (backend.name)"),
        Column("load_fraction", "float", "", "offered load as a fraction of capacity", min_value=0),
        Column(
            "offered_qps",
            "float",
            "req/s",
            "the load's arrival rate (sessions/s for a multi-turn workload: fidelity.json's "
            "capacity rate_unit)",
            min_value=0,
        ),
        Column(
            "clock",
            "str",
            "",
            "engine: the engine's own clock per request (what Vidur models); client: as the "
            "client saw it, the front end included",
            allowed=("engine", "client"),
        ),
        Column("metric", "str", "", "ttft, tpot or e2e", allowed=("ttft", "tpot", "e2e")),
        Column("stat", "str", "", "p50 or p90"),
        Column("real_ms", "float", "ms", "measured", nullable=True),
        Column("sim_ms", "float", "ms", "simulated", nullable=True),
        Column("rel_error", "float", "", "simulated / real - 1", nullable=True),
        Column("abs_rel_error", "float", "", "|rel_error|", nullable=True, min_value=0),
    ),
)

FIDELITY_TABLE_WITH_REPORT = TableSchema(
    name="fidelity_combined",
    version=FIDELITY_SCHEMA_VERSION,
    description=(
        "`fidelity.csv` of a combined report (a multirun's, or `fidelity.summarize`): the "
        "`fidelity` table's rows of every report, with the report's name first."
    ),
    columns=(Column("report", "str", "", "the fidelity run (its run id)"), *FIDELITY_TABLE.columns),
)
