"""Where things live: the run-directory template and the file names several stages share (the
workload, the profiling bundle, request and token metrics, the engine step log). Each stage lists
what it writes in its own ``contract.py``."""

from __future__ import annotations

import os
import re
from pathlib import Path

STAGES: tuple[str, ...] = (
    "workload",
    "vidur_profile",
    "vidur_simulate",
    "real_bench",
    "compare",
    "deep_profile",
    "pipeline",
    "fidelity",
    "capacity",
    "bench_import",
    "tune",
)

RUN_META = "run_meta.json"
INCOMPLETE_MARKER = ".incomplete"
"""Present while a run is being written, and left behind if it fails or is interrupted."""

# workload stage
PROMPTS = "prompts.jsonl"
TRACE_LENGTHS = "trace_lengths.csv"
TRACE_INTERVALS = "trace_intervals.csv"
WORKLOAD_META = "workload_meta.json"

# vidur profiling bundle: <profiling_root>/<hardware>/<model>/
PROFILING_ROOT = "tmp/profiles"
"""The default ``profiling_root`` of every stage that writes or reads bundles."""
MLP_PROFILE = "mlp.csv"
ATTENTION_PROFILE = "attention.csv"
BUNDLE_META = "meta.json"
ENGINE_STEPS = "engine_steps.csv"
SERVING_STEPS = "serving_steps.csv"
STEP_RESIDUALS_PLOT = "step_residuals.png"
"""Optional: the serving engine's measured step times (per backend), for the per-step overhead."""

# bench / simulate stages
REQUEST_METRICS = "request_metrics.csv"
TOKEN_METRICS = "token_metrics.csv"
ENGINE_STEP_LOG = "engine_step_log.csv"
"""The engine's steps: a real vLLM server's own per-step log, or Vidur's simulated batches."""
ENGINE_SCHEDULE = "engine_schedule.csv"
"""Every step a real vLLM engine's own scheduler took, on the engine's clock, request by request."""
FRONT_END_STAMPS = "front_end_stamps.csv"
"""When a vLLM server's API server received each request and handled its first output."""
RUNS_DIR = "runs"
"""An orchestrator's own stage runs (``<its run>/runs/<stage>/<run_id>/``): the pipeline's
repeat, re-runs, validation and recalibration; fidelity's, capacity's and tune's real and
simulated runs."""
ROUTER_READS = "router_reads.csv"
"""What the client's router read of each server when it routed each request."""

_RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=,+-]{0,127}$")


def validate_run_id(run_id: str) -> str:
    """Return ``run_id`` if it is a safe directory name, else raise ValueError saying why."""
    if not run_id or "/" in run_id or "\\" in run_id or ".." in run_id:
        raise ValueError(
            f"output.run_id={run_id!r} is not allowed: no path separators, no '..', not empty"
        )
    if not _RUN_ID.match(run_id):
        raise ValueError(
            f"output.run_id={run_id!r} is not allowed: use letters, digits and . _ = , + - "
            "(at most 128 characters, starting with a letter or digit)"
        )
    return run_id


def run_dir(root: Path | str, stage: str, run_id: str) -> Path:
    """``<root>/<stage>/<run_id>``: the only place a stage writes."""
    if stage not in STAGES:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(STAGES)}")
    return Path(root) / stage / validate_run_id(run_id)


LATEST = "latest"
"""``<output.root>/latest``: a link to the newest pipeline's compare run (its ``summary.md``)."""


def point_latest(root: Path | str, target: Path) -> Path:
    """Point ``<root>/latest`` at ``target`` (a run directory under ``root``), by a relative
    link swapped in at once: a reader sees the old link or the new one, never none. Returns the
    link."""
    link = Path(root) / LATEST
    staged = link.with_name(f".{LATEST}.{os.getpid()}")
    staged.unlink(missing_ok=True)
    staged.symlink_to(os.path.relpath(Path(target).resolve(), link.parent.resolve()))
    os.replace(staged, link)
    return link


def bundle_dir(profiling_root: Path | str, hardware: str, model: str) -> Path:
    """``<profiling_root>/<hardware>/<model>``: where a Vidur profiling bundle lives."""
    for label, value in (("hardware.name", hardware), ("model.name", model)):
        if not value or "/" in value or ".." in value:
            raise ValueError(f"{label}={value!r} cannot name a bundle directory")
    return Path(profiling_root) / hardware / model
