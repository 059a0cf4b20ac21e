"""The tune's report: the ranked table on the terminal and in ``report.md``, the recommended
``vllm serve`` flags, and the real check beside the simulation (from ``tune.json``'s document
and ``tune.csv``'s table; no computation here)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from gpu_simulate_test.capacity.report import requests_judged
from gpu_simulate_test.capacity.seeds import seeds_said
from gpu_simulate_test.core.reporting import console, markdown_table, print_table
from gpu_simulate_test.tune.space import CONFIGURED_ID
from gpu_simulate_test.tune.verdict import no_best_said, verdict_lines

SHOWN_ROWS = 12
"""Rows of the ranked table on the terminal (the report lists every configuration)."""


def _num(value: Any, digits: str = "g") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "–"
    return f"{float(value):{digits}}"


def ranked_cells(
    frame: pd.DataFrame, objective: str, limit: int | None = None, compact: bool = False
) -> tuple[list[str], list[list[str]]]:
    """The ranked table's header and rows (every configuration, or the first ``limit``); a
    fleet's with its GPUs and router, and ``compact`` without the engine's knobs."""
    value = "capacity (req/s)" if objective == "capacity" else "goodput (req/s)"
    header = ["#", "configuration", "seqs", "tokens", "chunked", "blocks", "prefix cache", value,
              "TTFT", "TPOT", "E2E", "limited by", "measured (req/s)"]  # fmt: skip
    rows = []
    for _, row in (frame if limit is None else frame.head(limit)).iterrows():
        score = row["capacity_qps"] if objective == "capacity" else row["goodput_qps"]
        name = str(row["config_id"])
        if bool(row["configured"]) and name != CONFIGURED_ID:  # not "configured (configured)"
            name += " (configured)"
        refused = row["invalid"] if isinstance(row["invalid"], str) else ""
        binds = row["binding"] if isinstance(row["binding"], str) else ""
        rows.append([
            str(row["rank"]), name, str(row["max_num_seqs"]), str(row["max_num_batched_tokens"]),
            "on" if row["enable_chunked_prefill"] else "off", str(row["num_gpu_blocks_override"]),
            "on" if row["enable_prefix_caching"] else "off",
            f"refused: {refused}" if refused else _num(score) + seed_cell(row, compact),
            _num(row["ttft_ms"], ".1f"), _num(row["tpot_ms"], ".1f"), _num(row["e2e_ms"], ".1f"),
            binds, _num(row["measured_qps"]),
        ])  # fmt: skip
    if "replicas" in frame and (frame["replicas"] > 1).any():  # a fleet: its GPUs and router
        header[2:2] = ["GPUs", "router"]
        for cells, (_, data) in zip(rows, frame.iterrows(), strict=False):
            router = data["router"] if isinstance(data["router"], str) else "–"
            cells[2:2] = [str(data["replicas"]), router]
        if compact:  # the id names the varied knobs: the terminal keeps the results
            header[4:9] = []
            for cells in rows:
                cells[4:9] = []
    return header, rows


GPU_HEADER = ("GPUs", "configuration", "router", "capacity (req/s)", "per GPU (req/s)")
"""The columns of the most each GPU count serves (:func:`gpu_cells`), in the report and the
terminal."""


def gpu_cells(row: Mapping[str, Any]) -> list[str]:
    cells = [str(row["gpus"]), str(row["config_id"]), str(row["router"] or "–")]
    return [*cells, _num(row["capacity_qps"]), _num(row["capacity_per_gpu_qps"])]


def command_of(doc: Mapping[str, Any], best: Mapping[str, Any]) -> str:
    """The recommended configuration's ``vllm serve`` command (a fleet's, where it is one)."""
    deploy = best.get("deploy")
    if deploy:
        return str(deploy["command"])
    return f"vllm serve {doc['model']} " + " ".join(best["flags"])


def gpu_lines(doc: Mapping[str, Any]) -> list[str]:
    """``report.md``'s "How many GPUs" section (empty without fleets in the space)."""
    target, front = doc.get("target"), doc.get("gpu_frontier")
    if not target and not front:
        return []
    lines = ["## How many GPUs", ""]
    if target and target.get("config_id"):
        deploy = target["deploy"]
        routed = f" behind {deploy['router']}" if deploy.get("router") else ""
        lines += [
            f"For **{target['target_qps']:g} req/s** within the goals: **{target['gpus']} "
            f"GPU(s)**, {target['config_id']} ({deploy['servers']} server(s){routed}), "
            f"simulated capacity {_num(target['capacity_qps'])} req/s "
            f"({target['headroom_pct']:+g}% headroom):",
            "",
            "```",
            str(deploy["command"]),
            "```",
            "",
        ]
    elif target:
        lines += [f"**{target['note']}**", ""]
    if front:
        lines += [
            "The most each GPU count serves within the goals (simulated; a count whose best "
            "serves no more than fewer GPUs is left out):",
            "",
            markdown_table(
                GPU_HEADER,
                [gpu_cells(f) for f in front],
            ),
            "",
            "Fleets are simulated; `tune.verify` checks those it picks on real servers (one "
            "`--data-parallel-size N` server behind vLLM's own balancer, or N servers behind the "
            "client's router, each engine on cores or a GPU of its own; the in-process engine's "
            "fleets are simulated only). A fleet sharing the cores of a small host with its "
            "client measures the host more than the fleet (*server's steps / model's* below).",
            "",
        ]
    return lines


def seed_cell(row: pd.Series, compact: bool) -> str:
    """`` (low–high)``: a capacity's range over the noise seeds, in the report's table."""
    low, high = row.get("capacity_seed_low_qps"), row.get("capacity_seed_high_qps")
    known = all(isinstance(v, float) and math.isfinite(v) for v in (low, high))
    return "" if compact or not known else f" ({low:g}–{high:g})"


def seeds_sentence(record: Mapping[str, Any]) -> str:
    """``tune.json`` ``sim_seeds`` in one line, for the terminal and the report."""
    seeds = record["seeds"]
    spread = record.get("median_spread")
    worst = max(
        record["spread"].items(), key=lambda kv: -1.0 if kv[1] is None else kv[1], default=None
    )
    said = (
        f"; over them a configuration's capacity spreads {100 * spread:.0f}% (median, max / "
        f"min − 1), {100 * (worst[1] or 0.0):.0f}% at most ({worst[0]})"
        if spread is not None and worst is not None
        else ""
    )
    if not said:  # no configuration answered with two seeds: no spread to tell apart by
        return (
            f"each configuration simulated with {record['count']} noise seeds "
            f"({seeds_said(seeds)}), the median one answering; no capacity over them to spread"
        )
    return (
        f"each configuration simulated with {record['count']} noise seeds "
        f"({seeds_said(seeds)}), the median one answering{said}: two capacities closer than "
        "that are not told apart by the simulation"
    )


def shared_rate_said(doc: Mapping[str, Any]) -> str:
    """What the latency columns' shared rate is under the capacity objective: the configured
    backend's simulated capacity, or, where it has none, the reference the search fell back to
    (``capacity.qps_min``, or the first valid configuration's capacity)."""
    configured = doc.get("configured_score")
    if configured is not None and configured > 0:
        return "the configured backend's capacity"
    return "the reference rate: the configured backend has no simulated capacity"


def target_said(target: Mapping[str, Any]) -> str:
    """``2 GPU(s), r2-rr-s32-t128-pc, simulated capacity 172.5 req/s (+15% headroom)``, or why
    no configuration meets the target."""
    if not target.get("gpus"):
        return str(target["note"])
    return (
        f"{target['gpus']} GPU(s), {target['config_id']}, simulated capacity "
        f"{_num(target['capacity_qps'])} req/s ({target['headroom_pct']:+g}% headroom)"
    )


def print_result(doc: Mapping[str, Any], frame: pd.DataFrame, where: Path) -> None:
    pct, objective = doc["slo"]["percentile"], doc["objective"]
    header, rows = ranked_cells(frame, objective, SHOWN_ROWS, compact=True)
    at = doc.get("shared_rate_qps")
    title = f"tune: {doc['configurations']} configurations, latency p{pct} (ms)"
    if at is not None:
        title += f" at {at:g} req/s"
        if objective == "capacity":  # goodput's is tune.qps
            title += f" ({shared_rate_said(doc)})"
    print_table(title, header, rows)
    if doc.get("gpu_frontier"):
        print_table(
            "the most each GPU count serves within the goals (simulated)",
            GPU_HEADER,
            [gpu_cells(f) for f in doc["gpu_frontier"]],
        )
    best = doc.get("best")
    target = doc.get("target")
    if target:
        console.print(f"[bold]for {target['target_qps']:g} req/s:[/] {target_said(target)}")
    if best:
        console.print(f"[bold]recommended:[/] {command_of(doc, best)}")
    else:
        console.print(f"[bold red]{no_best_said(doc)}[/]")
    for line in verdict_lines(doc)[1:] if best else ():
        console.print(f"[bold]verdict:[/] {line}")
    seeds = doc.get("sim_seeds") or {}
    if seeds.get("count", 1) > 1:
        console.print(f"[bold]seeds:[/] {seeds_sentence(seeds)}")
    if doc.get("calibrations"):
        console.print(f"[bold]calibrations:[/] {calibrations_sentence(doc['calibrations'])}")
    verified = doc.get("verify")
    if verified:
        console.print(verify_sentence(verified))
        if doc.get("recalibration"):
            console.print(
                f"[bold yellow]calibration:[/] {recalibration_sentence(doc['recalibration'])}"
            )
        speed = verified.get("calibration_speed") or {}
        if speed.get("note"):
            console.print(f"[bold yellow]calibration:[/] {speed['note']}")
    console.print(f"report: {where / 'report.md'}")


def verify_sentence(verified: Mapping[str, Any]) -> str:
    tied = verified.get("tied_best") or []
    agrees = verified.get("agrees", verified.get("measured_best_in_sim_top2"))
    said = {True: "is among", False: "is NOT among", None: "cannot be compared with"}[agrees]
    best = (
        f"the measured best, {verified['measured_best']},"
        if len(tied) <= 1
        else f"a tied best ({', '.join(tied)}: within the spread between servers),"
    )
    ranking = verified.get("judged_ranking", "simulation")
    return (
        f"on the real engine ({verified['mode']}, {len(verified['configs'])} configurations, "
        f"{verified['wall_time_s']:g} s): {best} {said} the {ranking}'s top 2"
    )


def report_markdown(run_id: str, doc: Mapping[str, Any], frame: pd.DataFrame) -> str:
    pct, objective = doc["slo"]["percentile"], doc["objective"]
    goals = ", ".join(f"{m.upper()} p{pct} ≤ {v:g} ms" for m, v in doc["slo"]["goals_ms"].items())
    lines = [
        f"# Tune: {run_id}",
        "",
        *(f"- {line}" for line in verdict_lines(doc)),
        "",
        f"{doc['model']} on {doc['hardware']}, vLLM ({doc['backend']}), "
        f"{requests_judged(doc)} of the workload per simulated rate; goals: {goals}; "
        f"objective: {objective}"
        + (f" at {doc['shared_rate_qps']:g} req/s" if objective == "goodput" else "")
        + ".",
        "",
        f"{doc['configurations']} configurations ({doc['refused']} refused), "
        f"{doc['simulations']} simulations in {doc['simulated_wall_s']:g} s; "
        f"{doc['wall_time_s']:g} s in all.",
        "",
    ]
    best = doc.get("best")
    if best:
        lines += [
            f"**Recommended** ({best['config_id']}, simulated {objective} "
            f"{_num(best['score'])} req/s, against {_num(doc['configured_score'])} configured):",
            "",
            "```",
            command_of(doc, best),
            "```",
            "",
        ]
    else:
        lines += [f"**{no_best_said(doc)}**", ""]
    lines += gpu_lines(doc)
    cal = doc["calibrated_with"]
    lines += [
        "Every configuration was simulated from one profile and one engine calibration, made "
        f"with max_num_seqs={cal['max_num_seqs']}, max_num_batched_tokens="
        f"{cal['max_num_batched_tokens']}, num_gpu_blocks_override="
        f"{cal['num_gpu_blocks_override']}, prefix caching "
        f"{'on' if cal['enable_prefix_caching'] else 'off'} (the space's largest, so that its "
        "experiments cover every configuration's steps).",
        "",
    ]
    if doc.get("shared_rate_qps") is not None and objective == "capacity":
        lines += [
            f"Latency columns: p{pct} at {doc['shared_rate_qps']:g} req/s, "
            f"{shared_rate_said(doc)} (the same load for every configuration).",
            "",
        ]
    header, rows = ranked_cells(frame, objective)
    lines += ["## Ranked", "", markdown_table(header, rows), "", "![pareto](tune.png)", ""]
    seeds = doc.get("sim_seeds") or {}
    if seeds.get("count", 1) > 1:
        lines += [f"**Seeds:** {seeds_sentence(seeds)}.", ""]
    if doc.get("calibrations"):
        lines += [f"**Calibrations:** {calibrations_sentence(doc['calibrations'])}.", ""]
    if doc.get("recalibration"):
        lines += [f"**A second calibration:** {recalibration_sentence(doc['recalibration'])}.", ""]
    verified = doc.get("verify")
    if verified:
        lines += verify_markdown(verified)
    return "\n".join(lines) + "\n"


def agreement_cell(row: Mapping[str, Any]) -> str:
    """Each goal percentile's mean signed error over the real rates that met the goals."""
    below = (row.get("latency_agreement") or {}).get("where_real_met") or {}
    cells = []
    for key, summary in below.items():
        error = summary.get("mean_signed_error")
        if error is not None:
            metric, _, q = key.partition("_p")
            cells.append(f"{metric.upper()} p{q} {error:+.1%}")
    return ", ".join(cells) or "–"


def verify_markdown(verified: Mapping[str, Any]) -> list[str]:
    first = any("first_calibration_qps" in row for row in verified["configs"])
    header = ["configuration", "simulated (req/s)", "measured (req/s)", "measured bracket",
              "sim / measured", "latency, sim / real − 1 where real met",
              "server's steps / model's", "simulated at that level (req/s)",
              "rates run", "disturbed",
              "wall (s)"]  # fmt: skip
    if first:
        header.insert(2, "first calibration (req/s)")
    rows = []
    for row in verified["configs"]:
        low, high = row["measured_bracket_qps"]
        rows.append([
            row["config_id"], _num(row["simulated_qps"]), _num(row["measured_qps"]),
            f"{_num(low)} .. {_num(high)}", _num(row["ratio"], ".3f"), agreement_cell(row),
            level_cell(row.get("server_step_level")),
            _num(row.get("simulated_at_server_level_qps")), str(len(row["rates"])),
            ", ".join(f"{q:g}" for q in row["disturbed_rates"]) or "none",
            _num(row["wall_time_s"]),
        ])  # fmt: skip
        if first:
            rows[-1].insert(2, _num(row.get("first_calibration_qps")))
    lines = [
        f"## On the real engine (tune.verify={verified['mode']})",
        "",
        verify_sentence(verified) + ".",
        "",
        markdown_table(header, rows),
        "",
    ]
    speed = verified.get("calibration_speed") or {}
    if speed.get("note"):
        lines += [f"**Calibration:** {speed['note']}.", ""]
    if verified.get("spearman") is not None:
        lines += [
            f"Spearman rank correlation, simulated vs measured: {verified['spearman']:.2f}.",
            "",
        ]
    lines += [
        "*Server's steps / model's*: how long each server's busy steps took, in all, against "
        "the simulation's step model timing the same steps (their composition, and the load "
        "around each for the serving terms); the lowest and highest of its rates in brackets, "
        "and the level at the two rates that decided the measured capacity (*judged*). "
        "The simulation runs at its calibration's speed; near a latency goal a few percent of step "
        "time move the capacity several times as much (the capacity stage's `step_band`), so a "
        "server that ran slower or faster than its calibration explains a capacity missed in "
        "that direction; one that ran at the calibration's speed (about 1.00) leaves the "
        "difference to the model. *Simulated at that level*: the configuration's simulated "
        "search again with every step's time times its level at the judged rates "
        "(`vidur.step_time_scale`; where the engine runs on the host's CPU, whose cores its "
        "API server shares, the front end too: `vidur.frontend_time_scale`): against the "
        "measured capacity it shows what the model misses once the server's speed is known "
        "(a diagnosis, not the answer: it reads the judged runs)."
    ]
    return lines


def level_cell(level: Mapping[str, Any] | None) -> str:
    """``server_step_level`` as ``1.09× (runs 1.00–1.18; judged 1.15×)``, or – without one;
    the judged rates' level where the search ran other rates too."""
    if not level:
        return "–"
    runs = [r for r in level.get("per_run", []) if r is not None]
    judged = level.get("judged")
    parts = [f"runs {min(runs):.2f}–{max(runs):.2f}"] if len(runs) > 1 else []
    if judged and len(judged.get("rates", [])) < len(runs):
        parts.append(f"judged {float(judged['ratio']):.2f}×")
    return f"{level['ratio']:.2f}×" + (f" ({'; '.join(parts)})" if parts else "")


def recalibration_sentence(record: dict[str, Any]) -> str:
    """``tune.json`` ``recalibration`` in one line, for the terminal and the report."""
    if record.get("error"):
        return (
            f"calibrating again failed after {record['wall_time_s']:g} s ({record['error']}); "
            "the first calibration's answer is kept"
        )
    first, second = record["first"] or {}, record["second"] or {}
    before = f"{float(first['pooled_level']):.3f}" if first else "none"
    after = f"{float(second['pooled_level']):.3f}" if second else "none"
    verdict = (
        "adopted: the ranking, the best and the table below are simulated with it"
        if record["adopted"]
        else "kept the first: the servers were no closer to the second"
    )
    return (
        f"calibrated again ({record['wall_time_s']:g} s, bundle {record['bundle']}): the checked "
        f"servers' pooled step level {before} against the first calibration, {after} against "
        f"the second; {verdict}"
    )


def calibrations_sentence(record: dict[str, Any]) -> str:
    """``tune.json`` ``calibrations`` in one line, for the terminal and the report."""
    count, chosen = record["count"], record["chosen"]
    levels = record.get("levels")
    if not levels:
        return (
            f"{count} calibrations; no configuration meets the goals with every one of them: "
            f"calibration {chosen} (the first) answers"
        )
    spreads = [v for v in record["spread"].values() if v is not None]
    worst = max(record["spread"].items(), key=lambda kv: -1.0 if kv[1] is None else kv[1])
    said = ", ".join(f"{v:.2f}" for v in levels)
    return (
        f"{count} calibrations, each on a fresh server: their levels {said} of the median one, "
        f"calibration {chosen}, which answers; a configuration's {record['objective']} over "
        f"them spreads {100 * statistics.median(spreads):.0f}% (median, max / min − 1), "
        f"{100 * (worst[1] or 0.0):.0f}% at most ({worst[0]})"
    )
