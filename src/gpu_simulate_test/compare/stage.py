"""The ``compare`` stage: a real run against a simulated run of one workload, per request.

Writes ``comparison.json`` (every number), ``summary.md``, ``percentiles.csv``,
``requests.csv`` and PNG plots into ``<output.root>/compare/<run_id>/``; with ``sweep_dirs``,
a sweep report over several compare runs instead (:mod:`gpu_simulate_test.compare.sweep`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.record import SimulatedCalibration
from gpu_simulate_test.compare import plots, report
from gpu_simulate_test.compare.alignment import (
    alignment_markdown,
    plot_alignment,
)
from gpu_simulate_test.compare.at_level import (
    AtLevelRun,
    at_level_json,
    at_level_markdown,
    load_at_level,
    with_at_level,
)
from gpu_simulate_test.compare.calibration import (
    calibration_findings,
    host_memory,
    host_memory_markdown,
)
from gpu_simulate_test.compare.clocks import clock_rows, clocks_markdown, repeat_values
from gpu_simulate_test.compare.comparison import (
    Comparison,
    Excluded,
    compare,
    discrepancies,
    join_requests,
)
from gpu_simulate_test.compare.contract import (
    ALIGNMENT_PLOT,
    CDF_PLOT,
    COMPARISON_JSON,
    COMPARISON_PERCENTILES,
    COMPARISON_REQUESTS,
    COMPARISON_STEPS,
    ERROR_PLOT,
    PERCENTILES_CSV,
    REQUESTS_CSV,
    SCATTER_PLOT,
    STEPS_CSV,
    STEPS_PLOT,
    SUMMARY_MD,
    TTFT_PARTS_PLOT,
    TURN_PLOT,
)
from gpu_simulate_test.compare.front_end import front_end_requests
from gpu_simulate_test.compare.front_end import markdown as front_end_markdown
from gpu_simulate_test.compare.goodput import compare_goodput, goodput_markdown
from gpu_simulate_test.compare.groups import ttft_clocks
from gpu_simulate_test.compare.metrics import JoinedRequests
from gpu_simulate_test.compare.multi_turn import (
    compare_multi_turn,
    load_sessions,
    multi_turn_markdown,
)
from gpu_simulate_test.compare.prefix_cache import (
    compare_prefix_cache,
    prefix_cache_findings,
    prefix_cache_line,
    prefix_cache_markdown,
)
from gpu_simulate_test.compare.routing import compare_routing, routing_markdown
from gpu_simulate_test.compare.seeds import SeedRun, load_seeds, seeds_note, with_seeds
from gpu_simulate_test.compare.step_inputs import (
    Aligned,
    Steps,
    load_alignment,
    load_steps,
)
from gpu_simulate_test.compare.steps import steps_markdown
from gpu_simulate_test.compare.ttft_parts import behind_api_server, ttft_parts
from gpu_simulate_test.compare.ttft_parts_report import plot_ttft_parts, ttft_parts_markdown
from gpu_simulate_test.compare.verdict import check_replaced, run_state, verdict, verdict_markdown
from gpu_simulate_test.config.compare import CompareStageConfig
from gpu_simulate_test.core.engines.knobs import knob_mismatches
from gpu_simulate_test.core.host import host_probe
from gpu_simulate_test.core.metrics import window
from gpu_simulate_test.core.metrics.goodput import goals_text
from gpu_simulate_test.core.reporting import console, markdown_text, print_table
from gpu_simulate_test.core.run_inputs import (
    RunInput,
    check_same_workload,
    load_run,
    real_itls_s,
    setup,
)
from gpu_simulate_test.io.artifacts import write_csv, write_json
from gpu_simulate_test.io.runs import Run, default_run_id, start_run


def after_warmup(
    real: pd.DataFrame, sim: pd.DataFrame, warmup_s: float
) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """Both runs' requests without those that arrived in the real run's first ``warmup_s``
    seconds (:func:`gpu_simulate_test.core.metrics.window.in_window`), and how many were left
    out."""
    if warmup_s <= 0:
        return real, sim, 0
    keep = window.in_window(real, warmup_s)
    warm = set(real.loc[~keep, "request_id"].tolist())
    return real[keep], sim[~sim["request_id"].isin(warm)], len(warm)


@dataclass(frozen=True)
class Inputs:
    """Both runs (and the repeat), read, checked and compared before the run exists."""

    real: RunInput
    sim: RunInput
    repeat: RunInput | None
    real_requests: pd.DataFrame
    """The real run's requests after the warm-up."""
    sim_requests: pd.DataFrame
    warmup: int
    """Requests left out as the warm-up."""
    joined: JoinedRequests
    excluded: tuple[Excluded, ...]
    comparison: Comparison
    context: dict[str, Any]
    findings: list[str]
    memory: dict[str, Any] | None
    steps: Steps | None
    aligned: Aligned | None
    prefix_cache: dict[str, Any] | None = None
    """:func:`.prefix_cache.compare_prefix_cache`: None where neither run has cached tokens."""
    multi_turn: dict[str, Any] | None = None
    """:func:`.multi_turn.compare_multi_turn`: None without sessions."""
    sessions_skipped: str | None = None
    """Why a workload that may have sessions was not read (it is not there, or another)."""
    routing: dict[str, Any] | None = None
    """:func:`.routing.compare_routing`: None where neither run is a fleet."""
    fleet_aligned: list[dict[str, Any]] | None = None
    """A fleet on both sides: each engine's step-by-step alignment (:func:`.step_inputs.
    load_alignment`)."""
    seeds: tuple[SeedRun, ...] = ()
    """``sim_seed_dirs``: the same workload simulated with other seeds (:mod:`.seeds`)."""
    at_level: AtLevelRun | None = None
    """``at_level_dir``: the workload simulated at the real run's step level (:mod:`.at_level`)."""


def prepare(cfg: CompareStageConfig) -> Inputs:
    """Read both runs (and the repeat), check them and compare; raises before the run exists."""
    assert cfg.real_run_dir and cfg.sim_run_dir  # checked by the config
    real = load_run(cfg.real_run_dir, "real_bench")
    sim = load_run(cfg.sim_run_dir, "vidur_simulate")
    check_same_workload(real, sim)
    for replaced in cfg.replaced_runs:  # named in the verdict: runs of the truth, not any path
        check_replaced(replaced)
    repeat = None
    if cfg.real_repeat_dir:
        repeat = load_run(cfg.real_repeat_dir, "real_bench")
        check_same_workload(real, repeat)
    real_requests, sim_requests, warmup = after_warmup(
        real.requests, sim.requests, cfg.compare.warmup_s
    )
    where = f"{real.path} vs {sim.path}"
    joined, excluded = join_requests(real_requests, sim_requests, where=where)
    since = window.window_start_s(real.requests, cfg.compare.warmup_s)
    comparison = compare(joined, excluded, real_itls_s(real, joined.request_id), since)
    context = setup(real, sim)
    mismatches = knob_mismatches(
        real.meta.get("config", {}).get("backend", {}),
        sim.meta.get("scheduler") or {},
        sim.meta.get("num_blocks"),
    )
    if context["real"]["hardware"] != context["sim"]["hardware"]:
        mismatches["hardware"] = (context["real"]["hardware"], context["sim"]["hardware"])
    used = SimulatedCalibration.from_run_meta(sim.meta)
    ttfts = ttft_clocks(real_requests, sim_requests, joined)
    prefix = compare_prefix_cache(real_requests, sim_requests, joined, ttfts, real.meta, sim.meta)
    sessions, skipped = load_sessions(real, sim)
    turns = None if sessions is None else compare_multi_turn(sessions, joined, ttfts)
    findings = discrepancies(comparison, mismatches) + prefix_cache_findings(prefix)
    findings += calibration_findings(used)
    memory = host_memory(used, real.meta, None if repeat is None else repeat.meta)
    aligned, per_engine = load_alignment(real, sim)
    seeds = tuple(load_seeds(cfg.sim_seed_dirs, real, real_requests))
    return Inputs(
        real,
        sim,
        repeat,
        real_requests,
        sim_requests,
        warmup,
        joined,
        excluded,
        comparison,
        context,
        findings,
        memory,
        load_steps(real, sim, comparison, used),
        aligned,
        prefix,
        turns,
        skipped,
        compare_routing(real_requests, sim_requests, joined, sim.meta.get("oracle")),
        per_engine,
        seeds,
        load_at_level(cfg.at_level_dir, real, real_requests),
    )


def run(cfg: CompareStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """Compare ``cfg.real_run_dir`` with ``cfg.sim_run_dir`` (or report ``cfg.sweep_dirs``)."""
    if cfg.sweep_dirs:
        from gpu_simulate_test.compare.sweep import run_sweep

        return run_sweep(cfg, resolved_config)
    inputs = prepare(cfg)  # every input check happens before the run directory exists
    real, sim, repeat, comparison = inputs.real, inputs.sim, inputs.repeat, inputs.comparison
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    with start_run(cfg.output.root, "compare", run_id, resolved_config, cfg.output.overwrite) as r:
        r.update_meta(
            workload_id=real.workload_id,
            real_run_dir=str(real.path),
            sim_run_dir=str(sim.path),
            num_compared=len(inputs.joined),
            num_excluded=len(inputs.excluded),
            num_warmup_excluded=inputs.warmup,
            real_repeat_dir=None if repeat is None else str(repeat.path),
            sim_seed_dirs=[str(seed.path) for seed in inputs.seeds],
            at_level_dir=cfg.at_level_dir,
        )
        write_csv(
            r.file(PERCENTILES_CSV), report.percentile_frame(comparison), COMPARISON_PERCENTILES
        )
        write_csv(r.file(REQUESTS_CSV), report.requests_frame(comparison), COMPARISON_REQUESTS)
        again = None if repeat is None else repeat_metrics(repeat.requests, inputs.joined)
        drawn = draw_plots(comparison, r.path, inputs.context, again) if cfg.compare.plots else {}
        data = report.to_dict(comparison, inputs.context, inputs.findings)
        data["warmup"] = {"warmup_s": cfg.compare.warmup_s, "num_warmup_excluded": inputs.warmup}
        clocks = clock_rows(
            inputs.real_requests,
            inputs.joined,
            inputs.sim_requests,
            None if repeat is None else repeat.requests,
        )
        main = SeedRun(sim.path, None, inputs.sim_requests, inputs.joined)
        clocks = with_at_level(with_seeds(clocks, inputs.seeds, main), inputs.at_level)
        data["clocks"] = clocks
        data["at_real_step_level"] = at_level_json(inputs.at_level)
        again_requests = None if repeat is None else repeat.requests
        data["front_end_requests"] = front = front_end_requests(
            inputs.real_requests, inputs.joined, inputs.sim_requests, again_requests
        )
        parts = ttft_parts(
            real.path,
            inputs.real_requests,
            clocks,
            inputs.sim_requests,
            api_server=behind_api_server(real.meta),
        )
        data["ttft_parts"] = parts and {k: v for k, v in parts.items() if k != "per_request"}
        if parts is not None and cfg.compare.plots:
            title = f"where the first token's time goes: {inputs.context['real'].get('backend')}"
            plot_ttft_parts(parts, r.file(TTFT_PARTS_PLOT), title)
        good = compare_goodput(comparison, cfg.goodput)
        data["goodput"] = good
        data["host_memory"] = inputs.memory
        data["prefix_cache"] = inputs.prefix_cache
        data["multi_turn"] = inputs.multi_turn or (
            {"skipped": inputs.sessions_skipped} if inputs.sessions_skipped else None
        )
        if cfg.compare.plots and inputs.multi_turn is not None:
            title = f"TTFT by turn: {inputs.context['real'].get('backend')} vs simulation"
            plots.plot_ttft_by_turn(inputs.multi_turn["ttft_by_turn"], r.file(TURN_PLOT), title)
        data["routing"] = inputs.routing
        write_steps(r, cfg, inputs, data)
        data["verdict"] = judged = verdict_of(cfg, inputs, clocks, data.get("steps"))
        write_json(r.file(COMPARISON_JSON), data)
        text = summary_text(cfg, inputs, drawn, clocks, good, judged, parts, front)
        with open(r.file(SUMMARY_MD), "w", encoding="utf-8") as handle:
            handle.write(text)
    if cfg.progress:
        print_progress(inputs, r.path, clocks, good)
        for line in verdict_markdown(judged)[:-1]:
            console.print(markdown_text(line))
    return r.path


def verdict_of(
    cfg: CompareStageConfig,
    inputs: Inputs,
    clocks: list[dict[str, Any]] | None,
    steps: dict[str, Any] | None,
) -> dict[str, Any]:
    """The verdict (:mod:`.verdict`): the figures within the truth's noise, the largest gap's
    cause, and the disturbance of the real run, its repeat and the runs re-runs replaced."""
    runs = [run_state("real run", inputs.real.path)]
    if inputs.repeat is not None:
        runs.append(run_state("repeat", inputs.repeat.path))
    replaced = [run_state("replaced", path) for path in cfg.replaced_runs]
    totals = None if steps is None else steps.get("totals")
    ratio = None if inputs.at_level is None else inputs.at_level.ratio
    return verdict(inputs.comparison, clocks, totals, runs, replaced, ratio)


def write_steps(r: Run, cfg: CompareStageConfig, inputs: Inputs, data: dict[str, Any]) -> None:
    """The step comparison's table and plots into the run, its numbers into ``data``."""
    label = inputs.context["real"].get("backend")
    if inputs.steps is not None:
        real_steps, sim_steps, result = inputs.steps
        write_csv(r.file(STEPS_CSV), result.groups, COMPARISON_STEPS)
        data["steps"] = {"totals": result.totals, "findings": result.findings}
        if cfg.compare.plots:
            title = f"engine steps: {label} vs Vidur"
            plots.plot_steps(real_steps, sim_steps, result.groups, r.file(STEPS_PLOT), title)
    if inputs.aligned is not None:
        real_seq, sim_seq, alignment = inputs.aligned
        block = data.setdefault("steps", {})
        block["same_composition_fraction"] = alignment.same_composition_fraction
        block["alignment"] = alignment.to_dict()
        block["oracle"] = inputs.sim.meta.get("oracle")
        if inputs.fleet_aligned is not None:
            block["alignment_per_engine"] = inputs.fleet_aligned
        if cfg.compare.plots:
            title = f"{label} vs simulation"
            plot_alignment(real_seq, sim_seq, alignment, r.file(ALIGNMENT_PLOT), title)


def summary_text(
    cfg: CompareStageConfig,
    inputs: Inputs,
    drawn: Mapping[str, str],
    clocks: list[dict[str, Any]] | None,
    good: dict[str, Any] | None,
    judged: Mapping[str, Any] | None = None,
    parts: Mapping[str, Any] | None = None,
    front: Mapping[str, Any] | None = None,
) -> str:
    """``summary.md``: the verdict (``judged``), the report's sections, then the warm-up,
    goodput, both clocks with each request's own front end (``front``) and the first token's
    hops (``parts``), the prefix cache, multi-turn
    sessions, the host's memory, the engine steps and the step-by-step alignment."""
    lines = verdict_markdown(judged) if judged is not None else []
    text = report.summary_markdown(inputs.comparison, inputs.context, inputs.findings, drawn, lines)
    if inputs.warmup:
        text += (
            f"\nWarm-up: the {inputs.warmup} request(s) arriving in the run's first "
            f"{cfg.compare.warmup_s:g} s were replayed and simulated, and are left out of "
            "every figure above and below (`compare.warmup_s`).\n"
        )
    text += goodput_markdown(good)
    text += clocks_markdown(clocks, seeds_note(inputs.seeds) if inputs.seeds else "")
    text += front_end_markdown(front)
    text += at_level_markdown(clocks, inputs.at_level)
    text += ttft_parts_markdown(parts, TTFT_PARTS_PLOT if cfg.compare.plots else None)
    text += prefix_cache_markdown(inputs.prefix_cache)
    turn_plot = TURN_PLOT if cfg.compare.plots else None
    text += multi_turn_markdown(inputs.multi_turn, turn_plot, inputs.sessions_skipped)
    text += host_memory_markdown(inputs.memory)
    text += routing_markdown(inputs.routing)
    if inputs.steps is not None:
        text += steps_markdown(inputs.steps[2], STEPS_PLOT if cfg.compare.plots else None)
    if inputs.aligned is not None:
        plot = ALIGNMENT_PLOT if cfg.compare.plots else None
        text += alignment_markdown(inputs.aligned[2], inputs.sim.meta.get("oracle"), plot)
        if inputs.fleet_aligned is not None:
            text += "\nA fleet: the alignment above is engine 0's; per engine, the share of steps "
            text += "of the same composition: " + ", ".join(
                f"engine {a['engine']} {100 * a['same_composition_fraction']:.1f}% "
                f"({a['real_steps']} real, {a['sim_steps']} simulated steps)"
                for a in inputs.fleet_aligned
            )
            text += " (`steps.alignment_per_engine`).\n"
    return text


def print_progress(
    inputs: Inputs,
    path: Path,
    clocks: list[dict[str, Any]] | None,
    good: Mapping[str, Any] | None,
) -> None:
    """The headline table and every finding on the terminal."""
    print_headline(inputs.comparison, inputs.context, inputs.findings, path, good)
    if clocks and "noise_vs_engine" in clocks[0]:
        console.print(noise_line(clocks))
    if (line := prefix_cache_line(inputs.prefix_cache)) is not None:
        console.print(line)
    if inputs.memory is not None:
        console.print(host_probe.line(inputs.memory["real"]))
    if inputs.steps is not None:
        for line in inputs.steps[2].findings:
            console.print(f"- {line}")
    if inputs.aligned is not None:
        a = inputs.aligned[2]
        console.print(
            f"- step by step: {a.same_composition_fraction:.1%} of steps the same "
            f"({a.real_steps} real, {a.sim_steps} simulated; preemptions "
            f"{a.preemptions.get('real')} real, {a.preemptions.get('sim')} simulated)"
        )


def repeat_metrics(repeat: pd.DataFrame, joined: JoinedRequests) -> dict[str, np.ndarray]:
    """The truth's second run's client-clock TTFT, TPOT and E2E (seconds) for the joined
    requests (NaN where it did not complete one)."""
    frame = repeat.set_index("request_id").reindex(joined.request_id)
    return {metric: repeat_values(frame, f"{metric}_s") for metric in plots.PLOT_METRICS}


def draw_plots(
    comparison: Comparison,
    out_dir: Path,
    context: Mapping[str, Any],
    repeat: Mapping[str, np.ndarray] | None = None,
) -> dict[str, str]:
    """Draw the three figures (the CDFs with the truth's spread when ``repeat`` is given);
    returns title → file name (relative to the run) for summary.md."""
    real = context["real"]
    where = f"{real.get('model')} on {real.get('hardware')}, {real.get('backend')} vs Vidur"
    cdfs = "CDFs, real vs simulated" + (" (shaded: real vs real)" if repeat else "")
    plots.plot_cdfs(comparison, out_dir / CDF_PLOT, f"{cdfs}: {where}", repeat)
    figures = {
        "predicted vs measured per request": (SCATTER_PLOT, plots.plot_scatter),
        "relative error by request length": (ERROR_PLOT, plots.plot_error_by_length),
    }
    for title, (name, draw) in figures.items():
        draw(comparison, out_dir / name, f"{title}: {where}")
    return {cdfs: CDF_PLOT, **{title: name for title, (name, _) in figures.items()}}


def print_headline(
    comparison: Comparison,
    context: Mapping[str, Any],
    findings: list[str],
    path: Path,
    good: Mapping[str, Any] | None = None,
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
    if good:
        console.print(
            f"goodput ({goals_text(good['goals_ms'])} ms): "
            f"real {good['real']['request_goodput']:.2f} req/s, "
            f"simulated {good['sim']['request_goodput']:.2f} req/s"
        )
    for line in findings:
        console.print(f"- {line}")
    console.print(f"[bold]artifacts:[/] {path}")


def noise_line(clocks: list[dict[str, Any]]) -> str:
    """The p50s of both clocks, simulator against the truth's own run-to-run difference."""
    p50 = [r for r in clocks if r["stat"] == "p50"]

    def pct(value: float) -> str:
        return f"{value:+.1%}" if value == value else "n/a"

    return "p50, " + "; ".join(
        f"{clock} clock: "
        + ", ".join(
            f"{r['metric'].upper()} sim {pct(r[f'error_vs_{clock}'])} / real vs real "
            f"{pct(r[f'noise_vs_{clock}'])}"
            for r in p50
        )
        for clock in ("engine", "client")
    )
