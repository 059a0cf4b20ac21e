"""The ``compare`` stage: a real run against a simulated run of one workload, per request.

Writes ``comparison.json`` (every number), ``summary.md``, ``percentiles.csv``,
``requests.csv`` and PNG plots into ``<output.root>/compare/<run_id>/``; with ``sweep_dirs``,
a sweep report over several compare runs instead (:mod:`gpu_simulate_test.analysis.sweep`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_simulate_test.analysis import plots, report
from gpu_simulate_test.analysis.comparison import Comparison, compare, discrepancies, join_requests
from gpu_simulate_test.analysis.inputs import (
    check_same_workload,
    load_run,
    real_itls_s,
    setup,
)
from gpu_simulate_test.analysis.knobs import knob_mismatches
from gpu_simulate_test.analysis.schemas import COMPARISON_PERCENTILES, COMPARISON_REQUESTS
from gpu_simulate_test.config.compare import CompareStageConfig
from gpu_simulate_test.io.artifacts import write_csv, write_json
from gpu_simulate_test.io.runs import default_run_id, start_run
from gpu_simulate_test.reporting import console, print_table

COMPARISON_JSON = "comparison.json"
SUMMARY_MD = "summary.md"
PERCENTILES_CSV = "percentiles.csv"
REQUESTS_CSV = "requests.csv"


def run(cfg: CompareStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """Compare ``cfg.real_run_dir`` with ``cfg.sim_run_dir`` (or report ``cfg.sweep_dirs``)."""
    if cfg.sweep_dirs:
        from gpu_simulate_test.analysis.sweep import run_sweep

        return run_sweep(cfg, resolved_config)
    assert cfg.real_run_dir and cfg.sim_run_dir  # checked by the config
    # every input check happens before the run directory exists
    real = load_run(cfg.real_run_dir, "real_bench")
    sim = load_run(cfg.sim_run_dir, "vidur_simulate")
    check_same_workload(real, sim)
    joined, excluded = join_requests(
        real.requests, sim.requests, where=f"{real.path} vs {sim.path}"
    )
    comparison = compare(joined, excluded, real_itls_s(real, joined.request_id))
    context = setup(real, sim)
    mismatches = knob_mismatches(
        real.meta.get("config", {}).get("backend", {}),
        sim.meta.get("scheduler") or {},
        sim.meta.get("num_blocks"),
    )
    if context["real"]["hardware"] != context["sim"]["hardware"]:
        mismatches["hardware"] = (context["real"]["hardware"], context["sim"]["hardware"])
    findings = discrepancies(comparison, mismatches)
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    with start_run(cfg.output.root, "compare", run_id, resolved_config, cfg.output.overwrite) as r:
        r.update_meta(
            workload_id=real.workload_id,
            real_run_dir=str(real.path),
            sim_run_dir=str(sim.path),
            num_compared=len(joined),
            num_excluded=len(excluded),
        )
        write_csv(
            r.file(PERCENTILES_CSV), report.percentile_frame(comparison), COMPARISON_PERCENTILES
        )
        write_csv(r.file(REQUESTS_CSV), report.requests_frame(comparison), COMPARISON_REQUESTS)
        drawn = draw_plots(comparison, r.path, context) if cfg.compare.plots else {}
        write_json(r.file(COMPARISON_JSON), report.to_dict(comparison, context, findings))
        text = report.summary_markdown(comparison, context, findings, drawn)
        with open(r.file(SUMMARY_MD), "w", encoding="utf-8") as handle:
            handle.write(text)
    if cfg.progress:
        print_headline(comparison, context, findings, r.path)
    return r.path


def draw_plots(comparison: Comparison, out_dir: Path, context: Mapping[str, Any]) -> dict[str, str]:
    """Draw the three figures; returns title → file name (relative to the run) for summary.md."""
    real = context["real"]
    where = f"{real.get('model')} on {real.get('hardware')}, {real.get('backend')} vs Vidur"
    figures = {
        "CDFs, real vs simulated": (plots.CDF_PLOT, plots.plot_cdfs),
        "predicted vs measured per request": (plots.SCATTER_PLOT, plots.plot_scatter),
        "relative error by request length": (plots.ERROR_PLOT, plots.plot_error_by_length),
    }
    for title, (name, draw) in figures.items():
        draw(comparison, out_dir / name, f"{title}: {where}")
    return {title: name for title, (name, _) in figures.items()}


def print_headline(
    comparison: Comparison, context: Mapping[str, Any], findings: list[str], path: Path
) -> None:
    real = context["real"]
    print_table(
        f"real {real.get('backend')} vs Vidur · {real.get('model')} on {real.get('hardware')} · "
        f"{context['workload_id']} · {len(comparison.joined)} requests",
        ["metric", "stat", "real (ms)", "simulated (ms)", "error (sim/real − 1)"],
        report.headline_rows(comparison),
    )
    tp_r, tp_s = comparison.throughput_real, comparison.throughput_sim
    console.print(
        f"throughput: real {tp_r.requests_per_s:.2f} req/s, {tp_r.output_tokens_per_s:.1f} tok/s; "
        f"simulated {tp_s.requests_per_s:.2f} req/s, {tp_s.output_tokens_per_s:.1f} tok/s"
    )
    for line in findings:
        console.print(f"- {line}")
    console.print(f"[bold]artifacts:[/] {path}")
