"""The fidelity stage's report: ``report.md`` (setup, capacity, the loads and their steady
state, the real runs' disturbance, the table on each clock, where the error lives, the largest
error beside the noise floor) and the summary over several reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from rich.text import Text

from gpu_simulate_test.core.metrics.window import STEADY_TREND
from gpu_simulate_test.core.reporting import markdown_text
from gpu_simulate_test.fidelity.at_level import at_level_lines
from gpu_simulate_test.fidelity.tables import (
    REQUEST_UNIT,
    SUSTAINED_RATIO,
    clock_of,
    error_spread,
    has_at_level,
    has_noise,
    headline,
    largest_abs_error,
    rate_unit,
)
from gpu_simulate_test.fidelity.verdict import verdict_lines


def summary_table(reports: Sequence[Mapping[str, Any]]) -> str:
    """A markdown table over several ``<name>-fidelity.json`` reports: per report and backend,
    requests per load, largest, median, rows within 5% / 10%, mean signed (computed from the
    rows), and the real-vs-real noise floor where the report has one."""
    lines = [
        "| report | requests per load | backend | largest abs error | median | ≤5% | ≤10% "
        "| mean signed | real vs real: largest / median / mean signed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for report in reports:
        table = pd.DataFrame(report["rows"])
        table["abs_rel_error"] = table["abs_rel_error"].astype(float)
        if "clock" not in table.columns:  # a report older than the two clocks
            table["clock"] = "client"
        for backend, part in headline(table).groupby("backend", sort=False):
            worst = largest_abs_error(part)["abs_error_pct"]
            spread = error_spread(part)
            floor = "–"
            if has_noise(part):
                noise = error_spread(part, "noise")
                largest = float(np.nanmax(np.abs(part["noise"].astype(float)))) * 100
                floor = f"{largest:.1f}% / {noise['median_abs_error_pct']:.1f}% / {_mean(noise)}"
            lines.append(
                f"| {report['name']} | {report.get('requests_per_load', '')} | {backend} | "
                f"{worst:.1f}% | {spread['median_abs_error_pct']:.1f}% | "
                f"{spread['within_5pct']}/{spread['rows']} | "
                f"{spread['within_10pct']}/{spread['rows']} | {_mean(spread)} | {floor} |"
            )
    return "\n".join(lines)


def _pct(value: float) -> str:
    return f"{value:+.1%}" if np.isfinite(value) else "–"


def where_error_lives(capacity: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The report's ``Where the error lives`` section: per load, the engine steps' attribution
    (loads whose compare run had a real step log); empty without any."""
    rows = [
        (backend, level)
        for backend, cap in capacity.items()
        for level in cap["loads"]
        if level.get("steps")
    ]
    if not rows:
        return []

    def pct(v: float | None) -> str:
        return "–" if v is None else f"{v:+.1%}"

    def ms(v: float | None) -> str:
        return "–" if v is None else f"{v:.1f}"

    def times(v: float | None) -> str:
        return "–" if v is None else f"{v:.2f}×"

    lines = [
        "",
        "## Where the error lives",
        "",
        "From each load's engine-step comparison (compare's `steps.csv`): *step time* is how much "
        "faster or slower Vidur's steps are than the engine's for the same compositions (engine "
        "loop included); *steps* and *busy time* compare the step count and the total time the "
        "engine was busy (scheduling shows in the count); *front end* is the mean TTFT the "
        "client saw beyond the engine's own clock (HTTP, the API server, streaming, the "
        "client), real and simulated, the same span on both sides; "
        "*host memory* is how long the host took to read one LM head around the real run over "
        "how long it took around the calibration (recorded, not judged: core/host/host_probe.py).",
        "",
        "| backend | load | step time | steps | busy time | front end real (ms) | "
        "front end simulated (ms) | host memory |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, level in rows:
        a = level["steps"]
        lines.append(
            f"| {backend} | {level['load_fraction']:.0%} | {pct(a['step_time_error'])} | "
            f"{pct(a['step_count_error'])} | {pct(a['busy_time_error'])} | "
            f"{ms(a['real_frontend_ms'])} | {ms(a['sim_frontend_ms'])} | "
            f"{times(a.get('host_memory_ratio'))} |"
        )
    return lines


def load_cell(fraction: float | None) -> str:
    """A real run's load in the Real runs table: ``50%``, or ``probe`` for the capacity probe."""
    return "probe" if fraction is None else f"{fraction:.0%}"


def disturbance_lines(
    real_runs: Sequence[Mapping[str, Any]] | None,
    unchecked: str = "a real phase older than the check",
) -> list[str]:
    """The report's account of the real runs: which were disturbed (late sends, held-back
    streams, foreign CPU) and what was done; ``None``: not checked (``unchecked`` says why)."""
    lines = ["", "## Real runs", ""]
    if real_runs is None:
        return [*lines, f"Not checked for disturbance ({unchecked})."]
    marked = [run for run in real_runs if run["disturbed"] or run["reruns"]]
    if not marked:
        signs = "late sends, held-back streams, foreign CPU"
        return [*lines, f"All {len(real_runs)} real runs undisturbed ({signs})."]
    lines += ["| backend | load | run | attempts | verdict |", "| --- | --- | --- | --- | --- |"]
    for run in marked:
        lines.append(
            f"| {run['backend']} | {load_cell(run['load_fraction'])} | {run['run']} | "
            f"{run['reruns'] + 1} | {run['verdict']} |"
        )
    return lines


def report_verdict(setup: Mapping[str, Any], table: pd.DataFrame) -> list[str]:
    """The report's verdict lines (:mod:`.verdict`), an import's runs judged by its own."""
    return verdict_lines(table, None if setup.get("imported") else setup.get("real_runs"))


def terminal_verdict(setup: Mapping[str, Any], table: pd.DataFrame) -> list[Text]:
    """The report's first lines, its verdict, for the terminal (its bold parts bold)."""
    return [markdown_text(line) for line in report_verdict(setup, table) if line.strip()]


def largest_said(worst: Mapping[str, Any]) -> str:
    """``TPOT p50 at 85% (vllm, engine clock), 25.3%``: :func:`..tables.largest_abs_error` in
    words (its clock named where it has one: the line beneath the client clock's verdict)."""
    if worst.get("abs_error_pct") is None:
        return "no row has both sides"
    clock = f", {worst['clock']} clock" if worst.get("clock") else ""
    return (
        f"{str(worst['metric']).upper()} {worst['stat']} at {load_cell(worst['load_fraction'])} "
        f"({worst['backend']}{clock}), {worst['abs_error_pct']:g}%"
    )


def markdown(
    name: str,
    setup: Mapping[str, Any],
    capacity: Mapping[str, Mapping[str, Any]],
    table: pd.DataFrame,
    plots: Mapping[str, str],
) -> str:
    """``report.md``: a partial report says so first, then the verdict (:mod:`.verdict`), setup,
    capacity, the table (metric × percentile × load) and the largest absolute error."""
    lines = [f"# Fidelity: {name}", ""]
    if setup.get("partial"):
        lines += [
            "**Partial report**: " + "; ".join(setup.get("notes") or ["see the loads"]) + ".",
            "",
        ]
    lines += report_verdict(setup, table)
    lines += [
        f"- {key}: {value}"
        for key, value in setup.items()
        if value is not None  # not recorded (no GPU driver, an import): not "None"
        and not isinstance(value, dict | list)
        and key not in ("partial", "schema_version")
    ]
    for key, value in setup.items():
        if isinstance(value, dict) and key != "imported":
            known = ", ".join(f"{k} {v}" for k, v in value.items() if v is not None)
            lines.append(f"- {key}: {known or 'not recorded'}")
    lines += [
        "",
        "Error = simulated / real − 1 (negative: the simulator predicts too fast). TTFT includes "
        "queueing; TPOT = (E2E − TTFT) / (output − 1).",
        "",
        "## Capacity",
        "",
        "| backend | probe requests | capacity | output tok/s |",
        "| --- | --- | --- | --- |",
    ]
    for backend, cap in capacity.items():
        tokens = cap.get("output_tokens_per_s")
        probe = cap["probe_requests"] or f"none ({cap.get('derived_from', 'capacity given')})"
        lines.append(
            f"| {backend} | {probe} | {capacity_cell(cap)} | "
            f"{'–' if tokens is None else f'{tokens:.1f}'} |"
        )
    imported = setup.get("imported")
    if imported:
        lines += imported_lines(imported)
    lines += loads_lines(capacity)
    if imported:
        lines += disturbance_lines(None, imported["disturbance"])
    else:
        lines += disturbance_lines(setup.get("real_runs"))
    lines += table_lines(table)
    lines += at_level_lines(table, capacity)
    lines += where_error_lives(capacity)
    lines += largest_lines(table)
    lines.append("")
    lines += [f"![{backend} latency vs load]({path})" for backend, path in plots.items()]
    lines.append("")
    return "\n".join(lines)


def capacity_cell(cap: Mapping[str, Any]) -> str:
    """A backend's capacity in its unit; a multi-turn probe's with the request rate behind it."""
    unit = rate_unit(cap)
    if unit == REQUEST_UNIT:
        return f"{cap['capacity_qps']:.4g} {unit}"
    return (
        f"{cap['capacity_qps']:.4g} {unit} ({cap['request_capacity_qps']:.4g} req/s over "
        f"{cap['turns_per_session']:.3g} turns per session; {cap['probe_sessions']} sessions "
        "at once, no think time)"
    )


def imported_lines(imported: Mapping[str, Any]) -> list[str]:
    """The report's ``Imported runs``: where the truth came from, how the capacity was derived,
    the checks an import cannot have, and the role of each imported run."""
    lines = [
        "",
        "## Imported runs",
        "",
        f"The truth is another tool's benchmark: {imported['tool']} `{imported['file']}` "
        f"(sha256 {str(imported.get('sha256'))[:12]}…), imported as `{imported['import_run']}`; "
        "the model, hardware, backend and bundle are this command's.",
        "",
        f"- **Capacity**: {imported['capacity_source']}.",
        f"- **Scheduler check**: {imported['scheduler_check']}.",
        f"- **Noise floor**: {imported['noise_floor']}.",
        "",
        "| imported run | role | requests | offered (req/s) | rate told (req/s) | real_bench run |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for run in imported["runs"]:
        offered, told = run["offered_qps"], run["nominal_qps"]
        lines.append(
            f"| {run['run']} | {run['role']} | {run['num_requests']} | "
            f"{'at once' if offered is None else f'{offered:.4g}'} | "
            f"{'–' if told is None else f'{told:g}'} | `{run['real_dir']}` |"
        )
    return lines


def _rate(value: Any) -> str:
    """A realized rate, 4 significant digits; ``–`` where a record has none (older runs)."""
    return "–" if value is None else f"{float(value):.4g}"


def loads_lines(capacity: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The report's ``Loads`` section: per load, its requests, how many warmed the queue up,
    completion / arrival and the queue's trend over the measured window, and the verdict."""
    lines = [
        "",
        "## Loads",
        "",
        "Requests arriving in a load's first seconds (warm-up) are replayed and simulated but left "
        "out of every figure. *Realized*: the rate the load's arrivals came at ((requests − 1) "
        "/ their span; a short load's differs from the offered one by chance). "
        "*Completion / arrival*: the rate requests finished over the rate "
        f"they came (below {SUSTAINED_RATIO} the queue grew); *queue trend*: median TTFT of the "
        "measured window's last third over its first third (the engine's TTFT where recorded; "
        f"above {STEADY_TREND} the queue kept growing). Steady: both within bounds.",
        "",
        "| backend | load | offered (rate) | realized | requests (warm-up) | completion / arrival "
        "| queue trend | steady |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, cap in capacity.items():
        for level in cap["loads"]:
            window = level.get("window") or {}
            flag = "" if level["sustained"] else " (queue grew)"
            trend = window.get("queue_trend")
            steady = window.get("steady")
            lines.append(
                f"| {backend} | {level['load_fraction']:.0%} | "
                f"{level['offered_qps']:.4g} {rate_unit(cap)} | "
                f"{_rate(level.get('realized_qps'))} | "
                f"{window.get('requests_measured', '–')} ({window.get('requests_warmup', 0)}) | "
                f"{level['completion_ratio']:.2f}{flag} | "
                f"{'–' if trend is None else f'{trend:.2f}'} | "
                f"{'–' if steady is None else ('yes' if steady else '**no**')} |"
            )
    return lines


def table_lines(table: pd.DataFrame) -> list[str]:
    """The report's table: per backend, clock (the engine's first), metric, percentile and load,
    with the real-vs-real noise floor beside the simulator's error when the truth was repeated."""
    noisy, levelled = has_noise(table), has_at_level(table)
    lines = ["", "## Table (ms)", ""]
    lines += [
        "*engine*: the engine's own clock per request (what Vidur models); *client*: as the "
        "client saw it, the front end (HTTP, API server, streaming) included.",
        "",
    ]
    head = "| backend | clock | metric | stat | load | real | simulated | error |"
    rule = "| --- | --- | --- | --- | --- | --- | --- | --- |"
    if noisy:
        lines += [
            "The real run was repeated on the same workload: *real again* is the repeat "
            "furthest from the first run, *real vs real* = again / real − 1, the noise floor "
            "of the truth.",
            "",
            head + " real again | real vs real |",
            rule + " --- | --- |",
        ]
    else:
        lines += [head, rule]
    if levelled:  # each load again at its real run's step level (At the real runs' own ...)
        lines[-2] += " at real step level | error there |"
        lines[-1] += " --- | --- |"
    for rec in table.to_dict("records"):
        row = (
            f"| {rec['backend']} | {rec.get('clock', 'client')} | {rec['metric']} | "
            f"{rec['stat']} | {rec['load_fraction']:.0%} | {rec['real_ms']:.2f} | "
            f"{rec['sim_ms']:.2f} | {_pct(rec['rel_error'])} |"
        )
        if noisy:
            row += f" {rec['real_repeat_ms']:.2f} | {_pct(rec['noise'])} |"
        if levelled:
            row += f" {rec['sim_at_level_ms']:.2f} | {_pct(rec['rel_error_at_level'])} |"
        lines.append(row)
    return lines


def largest_lines(table: pd.DataFrame) -> list[str]:
    """The report's ``Largest absolute error``: overall on each backend's headline clock (the
    engine's where recorded), then per backend and clock with the noise floor beside it."""
    noisy = has_noise(table)
    judged = headline(table)
    worst = largest_abs_error(judged)
    lines = ["", "## Largest absolute error", ""]
    if worst["abs_error_pct"] is None:
        return [*lines, "none (no finite row)"]
    clocks = ", ".join(f"{b}: {c}" for b, c in clock_of(table).items())
    lines.append(
        f"**{worst['abs_error_pct']:.1f}%** overall ({worst['backend']}, {worst['metric']} "
        f"{worst['stat']} at {worst['load_fraction']:.0%} of capacity; judged on the clock "
        f"{clocks})."
    )
    if "clock" not in table.columns:
        table = table.assign(clock="client")
    for (backend, clock), part in table.groupby(["backend", "clock"], sort=False):
        w = largest_abs_error(part)
        if w["abs_error_pct"] is None:
            continue
        spread = error_spread(part)
        lines.append(
            f"- {backend}, {clock} clock: {w['abs_error_pct']:.1f}% ({w['metric']} {w['stat']} "
            f"at {w['load_fraction']:.0%}); median {spread['median_abs_error_pct']:.1f}%, "
            f"{_signed(spread)}{spread['within_5pct']} of {spread['rows']} rows within 5%, "
            f"{spread['within_10pct']} within 10%"
        )
        if noisy and np.isfinite(part["noise"].astype(float)).any():
            floor = error_spread(part, "noise")
            lines.append(
                f"  - real vs real (noise floor): largest "
                f"{np.nanmax(np.abs(part['noise'].astype(float))):.1%}, median "
                f"{floor['median_abs_error_pct']:.1f}%, {_signed(floor)}{floor['within_5pct']} "
                f"of {floor['rows']} rows within 5%"
            )
    return lines


def _signed(spread: Mapping[str, Any]) -> str:
    """``mean signed +2.5%, `` (the bias beside the spread), or nothing without one."""
    return "" if spread.get("mean_signed_error_pct") is None else f"mean signed {_mean(spread)}, "


def _mean(spread: Mapping[str, Any]) -> str:
    """A spread's mean signed error (``+2.5%``), or ``–`` without one."""
    mean = spread.get("mean_signed_error_pct")
    return "–" if mean is None else f"{mean:+.1f}%"
