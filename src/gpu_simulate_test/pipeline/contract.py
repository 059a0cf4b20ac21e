"""What the pipeline writes: every stage's run under ``<output.root>/<stage>/<run_id>/`` with one
run id (each stage's own contract), its own ``tmp/pipeline/<run_id>/run_meta.json`` listing them
with their wall times, and after a multirun the sweep report of its jobs' compare runs."""

from __future__ import annotations

PIPELINE_STAGES: tuple[str, ...] = (
    "pipeline",
    "workload",
    "vidur_profile",
    "real_bench",
    "vidur_simulate",
    "compare",
)
"""Every run directory ``<output.root>/<stage>/<run_id>`` a pipeline may create, in order."""
SWEEP_SUFFIX = "sweep"
"""The report of the jobs ``<run_id>-0``, ``<run_id>-1``, … lands in ``compare/<run_id>-sweep``."""
