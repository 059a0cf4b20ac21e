"""The ``workload`` stage: sample or import requests and write the four workload artifacts
(:mod:`.contract`) into ``<output.root>/workload/<run_id>/``; the workload model itself is shared
(:mod:`gpu_simulate_test.core.traffic.workloads`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_simulate_test.config.schema import WorkloadStageConfig
from gpu_simulate_test.core.reporting import console, print_table
from gpu_simulate_test.core.traffic.workloads import generate, write_workload
from gpu_simulate_test.io.runs import default_run_id, start_run


def run(cfg: WorkloadStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """Build the workload described by ``cfg`` into ``<output.root>/workload/<run_id>/``."""
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    workload, notes = generate(cfg.workload, cfg.model)  # fail on bad input before creating the run
    with start_run(cfg.output.root, "workload", run_id, resolved_config, cfg.output.overwrite) as r:
        meta = write_workload(r, workload, cfg.workload, cfg.model, notes, cfg.progress)
        r.update_meta(workload_id=meta["workload_id"], num_requests=workload.num_requests)
    if cfg.progress:
        print_summary(meta, r.path)
    return r.path


def _session_cell(stats: Mapping[str, float], fmt: str, mean_fmt: str) -> str:
    """A session statistic in the table's min/p50/p90/p99/max columns (``workload_meta.json``
    keeps no p99 of these: a dash), its mean after them."""
    cells = [
        fmt.format(stats[q]) if q in stats else "–" for q in ("min", "p50", "p90", "p99", "max")
    ]
    return " / ".join(cells) + f" (mean {mean_fmt.format(stats['mean'])})"


def print_summary(meta: Mapping[str, Any], path: Path) -> None:
    summary = meta["summary"]
    rows = [
        ["requests", f"{summary['num_requests']}"],
        ["duration (s)", f"{summary['duration_s']:.2f}"],
    ]
    if "session" in meta:  # the request rate is the closed loop's; sessions arrive at a rate
        session = meta["session"]
        rate = summary["mean_sessions_per_s"]
        turns, think = session["turns_per_session"], session["think_time_s"]
        rows += [
            ["sessions", f"{session['num_sessions']}"],
            ["mean sessions/s", f"{rate:.3f}" if rate else "all at once"],
            ["turns per session", _session_cell(turns, "{:.0f}", "{:.1f}")],
            ["think time (s)", _session_cell(think, "{:.2f}", "{:.2f}")],
        ]
    else:
        rows.append(
            ["mean QPS", f"{summary['mean_qps']:.3f}" if summary["mean_qps"] else "all at once"]
        )
    for key, label in (
        ("num_prefill_tokens", "prompt tokens"),
        ("num_decode_tokens", "output tokens"),
    ):
        stats = summary[key]
        rows.append(
            [label, " / ".join(f"{stats[q]:.0f}" for q in ("min", "p50", "p90", "p99", "max"))]
        )
    if "prefix" in meta:
        prefix = meta["prefix"]
        rows.append(
            [
                f"shared prefixes ({prefix['share']})",
                f"{prefix['num_prefixes']} of {'/'.join(map(str, prefix['prefix_len_tokens']))} "
                f"tokens; requests each {'/'.join(map(str, prefix['requests_per_prefix']))}",
            ]
        )
    if "prompt_blocks" in meta:
        blocks = meta["prompt_blocks"]
        rows.append(
            [
                "prompt blocks (hash ids)",
                f"{blocks['distinct_hash_ids']} distinct of {blocks['block_tokens']} tokens; "
                f"{blocks['reusable_prompt_share']:.0%} of prompt tokens in repeated blocks",
            ]
        )
    print_table(
        f"workload {meta['workload_id']} ({meta['source']})",
        ["", "value (min/p50/p90/p99/max)"],
        rows,
    )
    console.print(f"[bold]artifacts:[/] {path}")
