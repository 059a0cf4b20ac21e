"""The capacity stage's report: ``report.md`` and the terminal's table, from ``capacity.json``'s
document (no computation here). Rates are in its ``rate_unit``: req/s, or sessions/s for a
multi-turn workload (then the answer in requests and concurrent users beside it)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pandas as pd

from gpu_simulate_test.capacity import contract
from gpu_simulate_test.capacity.band import band_cells, band_markdown
from gpu_simulate_test.capacity.seeds import answers_text, seeds_sentence
from gpu_simulate_test.capacity.sessions import REQUEST_UNIT, answer_in_load, unsteady_lines
from gpu_simulate_test.core.reporting import console, print_table

YES_NO: Mapping[bool | None, str] = MappingProxyType({True: "yes", False: "no", None: "–"})


def requests_judged(doc: Mapping[str, Any]) -> str:
    """Which requests each simulated rate judged: the whole workload, or with
    ``capacity.sim_window`` the real search's (the workload's first ⌈rate × seconds⌉)."""
    window = doc.get("sim_window")
    if not window:
        return f"{doc['num_requests']} requests"
    least = f", at least {window['min_requests']}" if window.get("min_requests") else ""
    most = f", at most {window['max_requests']}" if window.get("max_requests") else ""
    return (
        f"the first ⌈rate × {window['seconds']:g} s⌉ of {doc['num_requests']} requests{least}"
        f"{most} (the real search's)"
    )


def report_markdown(
    run_id: str,
    doc: Mapping[str, Any],
    frame: pd.DataFrame,
    base: Path,
    real_frame: pd.DataFrame | None = None,
) -> str:
    """``report.md``; links are relative to ``base``, where it is written."""
    pct = doc["slo"]["percentile"]
    unit = doc.get("rate_unit", REQUEST_UNIT)
    goals = ", ".join(f"{m.upper()} p{pct} ≤ {v:g} ms" for m, v in doc["slo"]["goals_ms"].items())
    sessions = doc.get("sessions")
    per_rate = f"{requests_judged(doc)} per rate"
    if sessions:
        per_rate = (
            f"{sessions['num_sessions']} sessions ({doc['num_requests']} requests) per rate, "
            f"the rate in {unit}"
        )
    lines = [
        f"# Capacity: {run_id}",
        "",
        f"{doc['model']} on {doc['hardware']}, the {doc['backend']} engine's knobs"
        f"{fleet_words(doc.get('fleet'))}, {per_rate}; goals: {goals}.",
        "",
        answer_sentence(doc, unit),
    ]
    if sessions and doc["answer_qps"] is not None:
        lines += unsteady_lines(sessions["at_answer"])
    if doc["note"]:
        lines += ["", f"Note: {doc['note']}."]
    if doc.get("sim_seeds"):
        lines += ["", f"Seeds: {seeds_sentence(doc['sim_seeds'], unit)}."]
    verified = doc.get("verify")
    lines += band_markdown(doc.get("step_band"), (verified or {}).get("measured_in_band"), unit)
    if verified and verified.get("mode") == "search":
        whole = None if doc.get("sim_window") else doc["num_requests"]
        lines += search_markdown(verified, pct, unit, whole)
    elif verified:
        lines += verify_markdown(verified, pct, base, unit)
    lines += [
        "",
        f"## The curve (p{pct}, ms)",
        "",
        *curve_header(unit, "simulated in (s)", "concurrent_users" in frame.columns),
        *curve_rows(frame, pct),
    ]
    if real_frame is not None:
        lines += [
            "",
            f"## The real engine's curve (p{pct}, ms; `{contract.CAPACITY_REAL_CSV}`)",
            "",
            *curve_header(unit, "measured in (s)", False),
            *curve_rows(real_frame, pct),
        ]
    lines += [
        "",
        "Goodput: requests per second that met every goal themselves (`vllm bench serve "
        "--goodput` with the goals' values, client clock), beside the percentile goals.",
        "",
        f"{doc['points']} simulated rates on the answering search's curve (other noise seeds' "
        f"and the step band's searches ran besides), {doc['simulated_requests_per_s']} "
        f"simulated requests/s over them; {doc['wall_time_s']} s in all"
        + (", the real engine's included." if doc.get("verify") else "."),
        "",
        f"![latency vs rate]({contract.CAPACITY_PLOT})",
        "",
    ]
    return "\n".join(lines)


def answer_sentence(doc: Mapping[str, Any], unit: str) -> str:
    """The answer in one sentence; with sessions, what it means in requests and users."""
    answer, above = doc["answer_qps"], doc["bracket_qps"][1]
    if answer is None:
        return "**No rate tried meets the goals.**"
    load = answer_in_load(answer, (doc.get("sessions") or {}).get("at_answer"))
    said = f"{answer:g} {unit}" + (f" ({load})" if load else "")
    if above is None:
        return f"**{said} or more**: every rate tried met the goals."
    return (
        f"**Highest rate within the goals: {said}** (the next rate tried, {above:g} {unit}, "
        f"missed: {'; '.join(doc['binding'])})."
    )


def curve_header(unit: str, wall: str, loads: bool) -> list[str]:
    """The curve table's header; ``loads``: with each rate in requests and users (sessions)."""
    extra = " req/s finished | concurrent users |" if loads else ""
    cells = f"| {unit} | phase | TTFT | TPOT | E2E | meets | goodput (req/s) |{extra} {wall} |"
    return [cells, "| --- " * cells.count(" | ") + "| --- |"]


def verify_markdown(
    verified: Mapping[str, Any], pct: int, base: Path, unit: str = REQUEST_UNIT
) -> list[str]:
    """``report.md``'s check of the answer on the real engine (``capacity.verify=answer``)."""
    verdict = (
        "meets" if verified["meets_slo"] else "misses (" + "; ".join(verified["violated"]) + ")"
    )
    lines = [
        "",
        f"On the real engine at {verified['qps']:g} {unit} the workload {verdict} the goals "
        f"([run]({os.path.relpath(verified['real_run'], base)})):",
        "",
        "| metric | real (ms) | simulated (ms) |",
        "| --- | --- | --- |",
    ]
    for key, real in verified["real_ms"].items():
        if key.endswith(f"_p{pct}"):
            simulated = verified["simulated_ms"].get(key, float("nan"))
            lines.append(f"| {key} | {real:.1f} | {simulated:.1f} |")
    if verified.get("real_goodput_qps") is not None:
        sim_good = verified.get("simulated_goodput_qps")
        lines.append(
            f"| goodput (req/s) | {verified['real_goodput_qps']:.2f} | "
            f"{'–' if sim_good is None else f'{sim_good:.2f}'} |"
        )
    return lines


def print_result(doc: Mapping[str, Any], path: Path) -> None:
    answer, unit = doc["answer_qps"], doc.get("rate_unit", REQUEST_UNIT)
    rows = [[f"answer ({unit})", "none" if answer is None else f"{answer:g}"]]
    if doc.get("sessions"):  # what the answer means in requests and users
        load = doc["sessions"]["at_answer"] or {}
        rows += [
            ["requests/s at the answer", _cell(load.get("request_rate_per_s"))],
            ["concurrent users at the answer", _cell(load.get("concurrent_users"), ".1f")],
        ]
        if load.get("steady") is False:
            rows[-1][1] += " (not steady: report.md)"
    rows.append(["limited by", "; ".join(doc["binding"]) or "–"])
    seeds = doc.get("sim_seeds")
    if seeds:
        said = f"{answers_text(seeds)} (the median, seed {seeds['chosen_seed']}, answers)"
        rows.append([f"answer per noise seed ({unit})", said])
    if doc.get("step_band"):
        pct = f"{doc['step_band']['fraction']:.0%}"
        rows.append([f"answer with steps ±{pct} ({unit})", band_cells(doc["step_band"])])
    rows += [
        ["simulated rates (answering curve)", str(doc["points"])],
        ["simulated requests/s", str(doc["simulated_requests_per_s"])],
    ]
    check = doc.get("verify")
    if check and check.get("mode") == "search":
        measured = check["measured_capacity_qps"]
        rows += [
            [f"measured capacity ({unit})", "none" if measured is None else f"{measured:g}"],
            ["answer / measured", _ratio_cell(check, unit)],
            ["measured within the band", YES_NO[check.get("measured_in_band")]],
            ["real search", search_summary(check, unit)],
            [
                f"disturbed rates ({unit}; judged, marked)",
                ", ".join(f"{q:g}" for q in check["disturbed_rates"]) or "none",
            ],
        ]
    elif check:
        rows.append(["real engine at the answer", "meets" if check["meets_slo"] else "misses"])
    print_table("capacity", ["", "value"], rows)
    console.print(f"[bold]report:[/] {path / contract.REPORT_MD}")


def _ratio_cell(check: Mapping[str, Any], unit: str) -> str:
    """The terminal's answer / measured: a wide bracket's said as against its low end."""
    ratio, wide = check["ratio"], _wide(check, unit)
    if ratio is None:
        return "–"
    return (
        f"{ratio:.2f}" if wide is None else f"{ratio:.2f} of the low end of {wide} (not narrowed)"
    )


def _cell(value: float | None, digits: str = ".2f") -> str:
    return "–" if value is None or value != value else f"{value:{digits}}"


def curve_rows(frame: pd.DataFrame, pct: int) -> list[str]:
    """The curve's table rows: one per rate tried (with a multi-turn search's per-rate columns,
    the rate in requests and users)."""
    loads = "concurrent_users" in frame.columns
    rows = []
    for rec in frame.to_dict("records"):
        extra = (
            f" {_cell(rec['request_rate_per_s'])} | {_cell(rec['concurrent_users'], '.1f')} |"
            if loads
            else ""
        )
        rows.append(
            f"| {rec['qps']:g} | {rec['phase']} | {rec[f'ttft_p{pct}_ms']:.1f} | "
            f"{rec[f'tpot_p{pct}_ms']:.1f} | {rec[f'e2e_p{pct}_ms']:.1f} | "
            f"{'yes' if rec['meets_slo'] else 'no'} | {_cell(rec['goodput_qps'])} |{extra} "
            f"{rec['sim_wall_s']:.1f} |"
        )
    return rows


def search_markdown(
    verified: Mapping[str, Any], pct: int, unit: str = REQUEST_UNIT, whole: int | None = None
) -> list[str]:
    """The real search's paragraph: the measured capacity beside the answer, what binds.
    ``whole``: the workload's requests where each simulated rate judged all of them (no
    ``capacity.sim_window``), which the latency agreement then says."""
    measured = verified["measured_capacity_qps"]
    sides = verified["binding"]
    lines = [
        "",
        f"**On the real engine** ({search_summary(verified, unit)}): measured capacity "
        + (f"**{measured:g} {unit}**" if measured is not None else "**none** (no rate met them)")
        + _ratio_clause(verified, unit),
        "",
        f"Binding goal (p{pct}; the first rate above the capacity missed): simulated "
        f"{'; '.join(sides['simulated']) or '–'}; real {'; '.join(sides['real']) or '–'}.",
    ]
    seconds = (verified.get("plan") or {}).get("seconds", 0)
    lines += agreement_lines(verified.get("latency_agreement"), unit, whole, seconds)
    if verified["note"]:
        lines += ["", f"Real search note: {verified['note']}."]
    if verified["disturbed_rates"]:
        rates = ", ".join(f"{q:g}" for q in verified["disturbed_rates"])
        lines += ["", f"Disturbed after their re-runs, judged and marked: {rates} {unit}."]
    return lines


def _wide(verified: Mapping[str, Any], unit: str) -> str | None:
    """The bracket a search left wide (its low end met the goals, its high end missed them, not
    as narrow as asked), in words; None where it narrowed it (records before 1.7 say nothing)."""
    low, high = verified["measured_bracket_qps"]
    if verified.get("bracket_narrow", True) or high is None:
        return None
    return f"{low:g}..{high:g} {unit}"


def _ratio_clause(verified: Mapping[str, Any], unit: str) -> str:
    """The answer against the measured capacity, or against a wide bracket's low end, said so."""
    ratio, wide = verified["ratio"], _wide(verified, unit)
    if ratio is None:
        return "."
    if wide is not None:
        return (
            f"; the simulated answer is {ratio:.2f}× its low end, but the search did not narrow "
            f"its bracket: the capacity lies somewhere in {wide}, and the ratio and the band are "
            "not judged."
        )
    return f"; the simulated answer is **{ratio:.2f}×** it."


def search_summary(verified: Mapping[str, Any], unit: str = REQUEST_UNIT) -> str:
    """How the real search ran, in a clause: its seed, its rates (each sized by time), its wall
    time, and where its budget stopped it."""
    what = "requests" if unit == REQUEST_UNIT else "sessions"
    seed, plan, runs = verified.get("seed") or {}, verified.get("plan") or {}, verified["runs"]
    counts = [run["requests"] for run in runs]
    said = f"{len(runs)} rate{'' if len(runs) == 1 else 's'}"
    if counts:
        span = f"{min(counts)}" if min(counts) == max(counts) else f"{min(counts)}–{max(counts)}"
        said += f" of {plan.get('seconds', 0):g} s of arrivals, {span} {what} each"
    if seed:
        source = "the simulated answer" if seed["from"] == "simulated" else "a burst probe"
        said += f", from {seed['qps']:.4g} {unit} ({source})"
    said += f", {verified['wall_time_s']:g} s"
    stopped = verified.get("stopped")
    if stopped:
        said += (
            f"; stopped by its budget of {plan.get('budget_s', 0):g} s before "
            f"{stopped['next_qps']:g} {unit}"
        )
    return said


def agreement_lines(
    agreement: Mapping[str, Any] | None,
    unit: str = REQUEST_UNIT,
    whole: int | None = None,
    seconds: float = 0.0,
) -> list[str]:
    """How far apart the two curves' goal percentiles are where the real engine met the goals:
    the latency error behind the capacity ratio; with ``whole`` (each simulated rate judged the
    workload's ``whole`` requests, each real rate its first ``seconds`` of them), said to be
    over different requests."""
    if not agreement or not agreement["met_rates"]:
        return []
    rates = ", ".join(f"{q:g}" for q in agreement["met_rates"])
    parts = []
    for key, summary in agreement["where_real_met"].items():
        errors = [
            e
            for q, e in zip(agreement["rates"], agreement["errors"][key], strict=True)
            if q in agreement["met_rates"] and e is not None
        ]
        if errors:
            parts.append(
                f"{key} {min(errors):+.1%}..{max(errors):+.1%} (median |error| "
                f"{summary['median_abs_error']:.1%})"
            )
    return [
        "",
        f"Latency behind it: at the rates both searches ran where the real engine met the goals "
        f"({rates} {unit}), simulated / real − 1: {'; '.join(parts)}. Near the goal the curve is "
        "flat, so a few percent of latency move the capacity by much more."
        + (
            ""
            if whole is None
            else f" Not the same requests: each simulated rate judged the whole workload ({whole} "
            f"requests), each real rate its first ⌈rate × {seconds:g} s⌉; near the goal a p90 "
            "over the first hundred and one over all differ by tens of percent "
            "(`capacity.sim_window=true` judges the simulated rates on the real search's)."
        ),
    ]


def fleet_words(fleet: Mapping[str, Any] | None) -> str:
    """``, 2 replicas behind round_robin (2 GPUs)`` for a fleet; empty for one engine."""
    if not fleet or int(fleet["replicas"]) == 1:
        return ""
    n = int(fleet["replicas"])
    return f", {n} replicas behind {fleet['router']} ({n} GPUs)"
