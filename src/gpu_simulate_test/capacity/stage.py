"""The ``capacity`` stage: the highest request rate that meets latency goals, by simulation.

1. **One workload** of the configured shape (``workload.*``, ``workload.num_requests``) is built
   at a reference rate into ``runs/workload/base``; every rate the search tries replays the same
   requests with their arrival times scaled (a Poisson or gamma process scales exactly: the
   workload stage would draw the same arrivals at that rate with the same seed).
2. **The bundle** the pipeline would use: reused when it covers the workload, else profiled (and
   the engine calibrated) as the pipeline does.
3. **The search** (:mod:`.search`): Vidur at ``capacity.points`` rates from ``qps_min`` to
   ``qps_max`` (the curve), then ``capacity.refine`` bisection steps; each rate is one
   simulation, judged against ``capacity.slo`` at its percentile.
4. **The check** (``capacity.verify``): the workload replayed on the real engine at the answer,
   judged against the same goals, next to what the simulation predicted there.

Writes ``capacity.csv``, ``capacity.json``, ``capacity.png`` and ``report.md``
(:mod:`.contract`) into ``<output.root>/capacity/<run_id>/``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from gpu_simulate_test.capacity import contract
from gpu_simulate_test.capacity.band import band_cells, band_markdown, band_record, in_band
from gpu_simulate_test.capacity.real_search import real_search, search_record
from gpu_simulate_test.capacity.search import (
    METRICS,
    Answer,
    Point,
    binding,
    judge,
    judged_point,
    search,
)
from gpu_simulate_test.capacity.split import (
    REFERENCE_QPS,
    bundle_and_workload,
    read_real,
    recorded_inputs,
    write_real,
)
from gpu_simulate_test.config.capacity import CapacityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import OutputConfig
from gpu_simulate_test.core.goodput import rate_of, table_goodput
from gpu_simulate_test.core.percentiles import LATENCY_PERCENTILES, latency_ms
from gpu_simulate_test.core.reporting import console, print_table, progress_bar
from gpu_simulate_test.io.artifacts import atomic_open, write_csv, write_json
from gpu_simulate_test.io.runs import Run, default_run_id, start_run
from gpu_simulate_test.orchestrate.configs import as_resolved, simulate_config, with_workload
from gpu_simulate_test.orchestrate.serving import served
from gpu_simulate_test.orchestrate.steps import make_workload, run_truth

YES_NO: dict[bool | None, str] = {True: "yes", False: "no", None: "–"}


def run(cfg: CapacityStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """The search into ``<output.root>/capacity/<run_id>/``; returns the run directory."""
    opts = cfg.capacity
    goals, pct = opts.slo.goals(), opts.slo.percentile
    # phase=sim: the real phase's run checked before the run directory exists (its bundle's
    # coverage and scheduler once the run has begun)
    source = read_real(Path(opts.real_from).resolve(), cfg) if opts.real_from else None
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    with start_run(cfg.output.root, "capacity", run_id, resolved_config, cfg.output.overwrite) as r:
        started = time.perf_counter()
        r.update_meta(phase=opts.phase)
        output = OutputConfig(root=str(r.file(contract.RUNS_DIR)), overwrite=True)
        inner = dataclasses.replace(cfg.pipeline(), output=output, progress=False)
        if source is not None:
            inner, decided, workload_dir = recorded_inputs(cfg, inner, source)
            r.update_meta(real_from=str(source.root), recorded_config=as_resolved(inner))
            # the report names the engine and device the real phase measured
            cfg = dataclasses.replace(
                cfg, model=inner.model, hardware=inner.hardware, backend=inner.backend
            )
        else:
            inner, decided, workload_dir = bundle_and_workload(cfg, inner, r)
        if opts.phase == "real":  # the GPU machine's half: the real search, no Vidur
            found, runs, wall = real_search(cfg, inner, r)
            root = Path(inner.profiling_root)
            write_csv(
                r.file(contract.CAPACITY_REAL_CSV),
                points_frame(found.points),
                contract.CAPACITY_TABLE,
            )  # the manifest last: the sim phase reads a run that got that far, and finished
            manifest = write_real(r, cfg, root, workload_dir, decided, found, runs, wall)
            r.update_meta(measured_capacity_qps=found.qps, workload_dir=str(workload_dir))
            if cfg.progress:
                said = "none" if found.qps is None else f"{found.qps:g} req/s"
                console.print(
                    f"[bold]measured capacity:[/] {said}; [bold]manifest:[/] {manifest}; "
                    f"simulate with capacity.phase=sim capacity.real_from={r.path}"
                )
            return r.path
        from gpu_simulate_test.vidur_simulate.stage import prepare, simulate_inputs

        sim_cfg = simulate_config(inner, decided.scheduler, workload_dir)
        # each rate reads the request table alone: no per-batch log
        sim_cfg = dataclasses.replace(
            sim_cfg, vidur=dataclasses.replace(sim_cfg.vidur, step_log=False)
        )
        inputs = prepare(sim_cfg)
        num_requests = len(inputs.arrival_time_s)
        r.update_meta(
            workload_dir=str(workload_dir),
            num_requests=num_requests,
            scheduler=dataclasses.asdict(decided.scheduler),
            bundle=str(inputs.bundle.path),
            slo={"percentile": pct, "goals_ms": goals},
        )
        scales = [1.0] + ([1.0 + opts.step_band, 1.0 - opts.step_band] if opts.step_band else [])
        total = (opts.points + opts.refine + opts.extend) * len(scales)
        answers = []
        with progress_bar("simulating rates", total, cfg.progress) as advance:
            for scale in scales:
                scaled_cfg = dataclasses.replace(
                    sim_cfg, vidur=dataclasses.replace(sim_cfg.vidur, step_time_scale=scale)
                )
                points_dir = r.file(contract.POINTS_DIR)
                if scale != 1.0:  # the band's searches: points/steps-x1.1/<qps>
                    points_dir = points_dir / f"steps-x{scale:g}"

                def evaluate(
                    qps: float, phase: str, at: Any = scaled_cfg, where: Path = points_dir
                ) -> Point:
                    t0 = time.perf_counter()
                    scaled = dataclasses.replace(
                        inputs, arrival_time_s=inputs.arrival_time_s * (REFERENCE_QPS / qps)
                    )
                    table = simulate_inputs(at, scaled, where / f"{qps:g}").table
                    advance(1)
                    return judged_point(qps, phase, table, opts.slo, time.perf_counter() - t0)

                answers.append(
                    search(
                        evaluate, opts.qps_min, opts.qps_max, opts.points, opts.refine, opts.extend
                    )
                )
        answer = answers[0]
        band = band_record(opts.step_band, *answers) if len(answers) == 3 else None
        verified, measured = None, None
        if opts.verify == "answer":
            verified = verify(cfg, inner, answer, goals, pct, r)
        elif opts.verify == "search":
            count = opts.verify_requests
            if source is not None:  # the real phase's search, recorded
                measured, runs, wall = source.measured, source.runs, source.wall_time_s
                count = source.requests_per_rate
            else:
                measured, runs, wall = real_search(cfg, inner, r)
            keys = tuple(f"{metric}_p{pct}" for metric in goals)
            verified = search_record(answer, measured, runs, wall, count, keys)
            verified["measured_in_band"] = in_band(measured.qps, band)
        doc = write_outputs(
            r, cfg, answer, verified, num_requests, time.perf_counter() - started, measured, band
        )
    if cfg.progress:
        print_result(doc, r.path)
    return r.path


def verify(
    cfg: CapacityStageConfig,
    inner: PipelineStageConfig,
    answer: Answer,
    goals: Mapping[str, float],
    pct: int,
    r: Run,
) -> dict[str, Any] | None:
    """The workload at the answer's rate on the real engine (one served engine, recorded in
    ``r``): its percentiles, the goals' verdict and the simulation's prediction there. None
    without an answer."""
    if answer.qps is None:
        return None
    from gpu_simulate_test.core.run_inputs import load_run

    if cfg.progress:
        console.rule(
            f"[bold]checking {answer.qps:g} req/s on the real engine ({inner.backend.name})"
        )
    at = with_workload(inner, "verify", qps=answer.qps)
    workload_dir = make_workload(at)
    with served(at, r.path, r, workload_dir, "the real check") as at_server:
        real_dir = run_truth(at_server, workload_dir)
    requests = load_run(real_dir, "real_bench").requests
    real = latency_ms(requests, METRICS)
    meets, missed = judge(real, goals, pct)
    point = next((p for p in answer.points if p.qps == answer.qps), None)
    predicted = point.latency_ms if point is not None else {}
    good = table_goodput(requests, cfg.capacity.slo.goodput_goals())
    return {
        "real_goodput_qps": rate_of(good),
        "simulated_goodput_qps": None if point is None else point.goodput_qps,
        "qps": answer.qps,
        "real_run": str(real_dir),
        "meets_slo": meets,
        "violated": list(missed),
        "real_ms": {k: round(v, 3) for k, v in real.items()},
        "simulated_ms": {k: round(float(v), 3) for k, v in predicted.items()},
    }


def points_frame(points: tuple[Point, ...]) -> pd.DataFrame:
    rows = []
    for p in points:
        row: dict[str, Any] = {"qps": p.qps, "phase": p.phase, "meets_slo": p.meets}
        for metric in METRICS:
            for q in LATENCY_PERCENTILES:
                row[f"{metric}_p{q}_ms"] = p.latency_ms[f"{metric}_p{q}"]
        row["goodput_qps"] = p.goodput_qps
        row["sim_wall_s"] = round(p.wall_s, 3)
        rows.append(row)
    return pd.DataFrame(rows, columns=contract.CAPACITY_TABLE.column_names)


def write_outputs(
    r: Run,
    cfg: CapacityStageConfig,
    answer: Answer,
    verified: dict[str, Any] | None,
    num_requests: int,
    wall_s: float,
    measured: Answer | None = None,
    band: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """capacity.csv, capacity.json, the plot and report.md (and, after a real search, its
    curve in capacity_real.csv); returns the JSON document."""
    from gpu_simulate_test.capacity.plots import plot_capacity

    frame = points_frame(answer.points)  # the band's searches are in capacity.json alone
    write_csv(r.file(contract.CAPACITY_CSV), frame, contract.CAPACITY_TABLE)
    real_frame = None
    if measured is not None:
        real_frame = points_frame(measured.points)
        write_csv(r.file(contract.CAPACITY_REAL_CSV), real_frame, contract.CAPACITY_TABLE)
    sim_s = float(frame["sim_wall_s"].sum())
    slo = cfg.capacity.slo
    doc = {
        "schema_version": contract.CAPACITY_SCHEMA_VERSION,
        "answer_qps": answer.qps,
        "bracket_qps": list(answer.bracket),
        "note": answer.note,
        "slo": {"percentile": slo.percentile, "goals_ms": slo.goals()},
        "binding": binding(answer),
        "step_band": band,
        "num_requests": num_requests,
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "backend": cfg.backend.name,
        "points": len(frame),
        "simulated_requests_per_s": round(num_requests * len(frame) / sim_s, 1) if sim_s else None,
        "wall_time_s": round(wall_s, 1),
        "verify": verified,
    }
    write_json(r.file(contract.CAPACITY_JSON), doc)
    plot_capacity(
        frame,
        slo.goals(),
        slo.percentile,
        answer.qps,
        r.file(contract.CAPACITY_PLOT),
        real_frame,
        None if measured is None else measured.qps,
        None if band is None else band["qps"],
        0.0 if band is None else band["fraction"],
    )
    with atomic_open(r.file(contract.REPORT_MD)) as handle:
        handle.write(report_markdown(r.run_id, doc, frame, r.path, real_frame))
    r.update_meta(
        answer_qps=answer.qps,
        points=len(frame),
        verified=(verified or {}).get("meets_slo"),
        measured_capacity_qps=None if measured is None else measured.qps,
    )
    return doc


def report_markdown(
    run_id: str,
    doc: Mapping[str, Any],
    frame: pd.DataFrame,
    base: Path,
    real_frame: pd.DataFrame | None = None,
) -> str:
    """``report.md``; links are relative to ``base``, where it is written."""
    pct = doc["slo"]["percentile"]
    goals = ", ".join(f"{m.upper()} p{pct} ≤ {v:g} ms" for m, v in doc["slo"]["goals_ms"].items())
    answer = doc["answer_qps"]
    lines = [
        f"# Capacity: {run_id}",
        "",
        f"{doc['model']} on {doc['hardware']}, the {doc['backend']} engine's knobs, "
        f"{doc['num_requests']} requests per rate; goals: {goals}.",
        "",
        (
            f"**Highest rate within the goals: {answer:g} req/s** (the next rate tried, "
            f"{doc['bracket_qps'][1]:g} req/s, missed: {'; '.join(doc['binding'])})."
            if answer is not None and doc["bracket_qps"][1] is not None
            else f"**{answer:g} req/s or more**: every rate tried met the goals."
            if answer is not None
            else "**No rate tried meets the goals.**"
        ),
    ]
    if doc["note"]:
        lines += ["", f"Note: {doc['note']}."]
    verified = doc.get("verify")
    lines += band_markdown(doc.get("step_band"), (verified or {}).get("measured_in_band"))
    if verified and verified.get("mode") == "search":
        lines += search_markdown(verified, pct)
    elif verified:
        verdict = (
            "meets" if verified["meets_slo"] else "misses (" + "; ".join(verified["violated"]) + ")"
        )
        lines += [
            "",
            f"On the real engine at {verified['qps']:g} req/s the workload {verdict} the goals "
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
    lines += [
        "",
        f"## The curve (p{pct}, ms)",
        "",
        "| req/s | phase | TTFT | TPOT | E2E | meets | goodput (req/s) | simulated in (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines += curve_rows(frame, pct)
    if real_frame is not None:
        lines += [
            "",
            f"## The real engine's curve (p{pct}, ms; `{contract.CAPACITY_REAL_CSV}`)",
            "",
            "| req/s | phase | TTFT | TPOT | E2E | meets | goodput (req/s) | measured in (s) |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |",
            *curve_rows(real_frame, pct),
        ]
    lines += [
        "",
        "Goodput: requests per second that met every goal themselves (`vllm bench serve "
        "--goodput` with the goals' values, client clock), beside the percentile goals.",
        "",
        f"{doc['points']} simulations, {doc['simulated_requests_per_s']} simulated requests/s; "
        f"{doc['wall_time_s']} s in all.",
        "",
        f"![latency vs rate]({contract.CAPACITY_PLOT})",
        "",
    ]
    return "\n".join(lines)


def print_result(doc: Mapping[str, Any], path: Path) -> None:
    answer = doc["answer_qps"]
    rows = [
        ["answer (req/s)", "none" if answer is None else f"{answer:g}"],
        ["limited by", "; ".join(doc["binding"]) or "–"],
    ]
    if doc.get("step_band"):
        pct = f"{doc['step_band']['fraction']:.0%}"
        rows.append([f"answer with steps ±{pct} (req/s)", band_cells(doc["step_band"])])
    rows += [
        ["simulations", str(doc["points"])],
        ["simulated requests/s", str(doc["simulated_requests_per_s"])],
    ]
    check = doc.get("verify")
    if check and check.get("mode") == "search":
        measured, ratio = check["measured_capacity_qps"], check["ratio"]
        rows += [
            ["measured capacity (req/s)", "none" if measured is None else f"{measured:g}"],
            ["answer / measured", "–" if ratio is None else f"{ratio:.2f}"],
            ["measured within the band", YES_NO[check.get("measured_in_band")]],
            ["real search (s)", f"{check['wall_time_s']:g}"],
        ]
    elif check:
        rows.append(["real engine at the answer", "meets" if check["meets_slo"] else "misses"])
    print_table("capacity", ["", "value"], rows)
    console.print(f"[bold]report:[/] {path / contract.REPORT_MD}")


def curve_rows(frame: pd.DataFrame, pct: int) -> list[str]:
    """The curve's table rows: one per rate tried."""
    rows = []
    for rec in frame.to_dict("records"):
        good = rec["goodput_qps"]
        rows.append(
            f"| {rec['qps']:g} | {rec['phase']} | {rec[f'ttft_p{pct}_ms']:.1f} | "
            f"{rec[f'tpot_p{pct}_ms']:.1f} | {rec[f'e2e_p{pct}_ms']:.1f} | "
            f"{'yes' if rec['meets_slo'] else 'no'} | "
            f"{'–' if good is None or good != good else f'{good:.2f}'} | {rec['sim_wall_s']:.1f} |"
        )
    return rows


def search_markdown(verified: Mapping[str, Any], pct: int) -> list[str]:
    """The real search's paragraph: the measured capacity beside the answer, what binds."""
    measured, ratio = verified["measured_capacity_qps"], verified["ratio"]
    sides = verified["binding"]
    lines = [
        "",
        f"**On the real engine, the same search** ({verified['requests_per_rate']} requests a "
        f"rate, {verified['wall_time_s']:g} s): measured capacity "
        + (f"**{measured:g} req/s**" if measured is not None else "**none** (no rate met them)")
        + (f"; the simulated answer is **{ratio:.2f}×** it." if ratio is not None else "."),
        "",
        f"Binding goal (p{pct}; the first rate above the capacity missed): simulated "
        f"{'; '.join(sides['simulated']) or '–'}; real {'; '.join(sides['real']) or '–'}.",
    ]
    lines += agreement_lines(verified.get("latency_agreement"))
    if verified["note"]:
        lines += ["", f"Real search note: {verified['note']}."]
    if verified["disturbed_rates"]:
        rates = ", ".join(f"{q:g}" for q in verified["disturbed_rates"])
        lines += ["", f"Disturbed after their re-runs, judged and marked: {rates} req/s."]
    return lines


def agreement_lines(agreement: Mapping[str, Any] | None) -> list[str]:
    """How far apart the two curves' goal percentiles are where the real engine met the goals:
    the latency error behind the capacity ratio."""
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
        f"({rates} req/s), simulated / real − 1: {'; '.join(parts)}. Near the goal the curve is "
        "flat, so a few percent of latency move the capacity by much more.",
    ]
