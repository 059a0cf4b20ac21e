"""The ``tune`` stage: the best vLLM knobs for a workload and latency goals, found by
simulation and confirmed on the real engine.

1. **The space** (:mod:`.space`): every combination of ``tune.space``'s knobs over the
   configured backend, each checked against vLLM's own rules (a configuration vLLM would refuse
   is listed, with why, and not simulated); the configured backend is always one of them.
2. **One workload, one bundle**: the capacity stage's (:func:`..capacity.split.
   bundle_and_workload`), profiled and calibrated with the space's largest knobs so that one
   calibration covers every configuration.
3. **The simulated search** (:mod:`.simulate`): the configured backend's capacity by the capacity
   stage's grid search, every other configuration's by a bracket search from there; or, with
   ``tune.objective=goodput``, each configuration's goodput at ``tune.qps``.
4. **The ranking** (:mod:`.rank`) and its Pareto frontier, the recommended ``vllm serve`` flags.
5. **The check** (``tune.verify``, :mod:`.verify`): the best few (or all) on real servers.

Writes ``tune.csv``, ``tune.json``, ``tune.png`` and ``report.md`` (:mod:`.contract`) into
``<output.root>/tune/<run_id>/``.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpu_simulate_test.capacity.real_search import RealSearch
from gpu_simulate_test.capacity.split import bundle_and_workload
from gpu_simulate_test.config.schema import ConfigError, nested_output
from gpu_simulate_test.config.tune import TuneStageConfig
from gpu_simulate_test.core.reporting import console, progress_bar
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import atomic_open, write_csv, write_json
from gpu_simulate_test.io.runs import Run, default_run_id, start_run
from gpu_simulate_test.orchestrate.steps import check_trace
from gpu_simulate_test.tune import calibrations, contract
from gpu_simulate_test.tune.fleet import frontier, most_replicas, target_answer
from gpu_simulate_test.tune.rank import (
    latency_at,
    pareto,
    ranked,
    score,
    seeds_record,
    spearman,
    table,
)
from gpu_simulate_test.tune.recalibrate import (
    adopt_rows,
    adopted_models,
    recalibrate,
    wanted,
)
from gpu_simulate_test.tune.simulate import (
    Simulated,
    TuneInputs,
    at_step_level,
    simulate_space,
    simulator_at,
    step_model,
)
from gpu_simulate_test.tune.space import (
    Candidate,
    calibration_backend,
    candidates,
    deployment,
    knobs_of,
    serve_flags,
)
from gpu_simulate_test.tune.verify import chosen, confirm, start_configured, summary


def run(cfg: TuneStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """The tune into ``<output.root>/tune/<run_id>/``; returns the run directory."""
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    space_checked = candidates(cfg.tune, cfg.backend, cfg.model, 1)  # the space, before any run
    check_trace(cfg.workload, cfg.model)
    with start_run(cfg.output.root, "tune", run_id, resolved_config, cfg.output.overwrite) as r:
        started = time.perf_counter()
        output = nested_output(cfg.output, r.file(layout.RUNS_DIR))
        inner = dataclasses.replace(cfg.pipeline(), output=output, progress=False)
        per_engine, most = 0, most_replicas(cfg)
        if most > 1 and inner.workload.num_requests > 0:  # the workload's requests per engine
            per_engine = inner.workload.num_requests  # of the largest fleet
            requests = per_engine * most
            inner = dataclasses.replace(
                inner, workload=dataclasses.replace(inner.workload, num_requests=requests)
            )
        calibrated = calibration_backend(space_checked)
        at_calibration = dataclasses.replace(cfg.as_capacity(), backend=calibrated)
        inner_cal = dataclasses.replace(inner, backend=calibrated)
        inner_cal, _, workload_dir = bundle_and_workload(at_calibration, inner_cal, r)
        inner = dataclasses.replace(inner_cal, backend=cfg.backend)
        lengths = load_workload(workload_dir).lengths
        longest = int((lengths["num_prefill_tokens"] + lengths["num_decode_tokens"]).max())
        found = candidates(cfg.tune, cfg.backend, cfg.model, longest)
        tuned = TuneInputs(
            cfg, inner, workload_dir, int(lengths["num_prefill_tokens"].max()),
            r.file(contract.POINTS_DIR), per_engine=per_engine,
        )  # fmt: skip
        r.update_meta(
            workload_dir=str(workload_dir),
            configurations=len(found),
            calibrated_with=knobs_of(calibrated),
        )
        pct = cfg.capacity.slo.percentile
        metric = next(iter(cfg.capacity.slo.goals()))
        rest = calibrations.others(cfg, r, inner_cal, tuned)  # before any server starts
        early = start_configured(cfg, inner, found, r)  # its start overlaps the simulation
        ensemble = None
        try:
            results, shared, order, simulated_s, note = simulated(cfg, tuned, found, metric, pct)
            if rest and not note:
                first = calibrations.Calibration(1, inner_cal, tuned)
                ensemble = calibrations.choose(cfg, first, results, shared, rest, found)
                inner_cal, tuned = ensemble.calibration.inner_cal, ensemble.calibration.tuned
                inner = tuned.inner
                results, shared = ensemble.results, ensemble.shared
                order = ranked(results, cfg.tune.objective, metric, pct)
                simulated_s += ensemble.simulated_s
            verified, recal = None, None
            searches: dict[str, RealSearch] = {}
            if cfg.tune.verify != "false" and not note:
                verified = confirm(
                    cfg, inner, chosen(order, cfg), r, simulator_at(tuned),
                    step_model(tuned), at_step_level(tuned), searches, early,
                )  # fmt: skip
        finally:
            if early is not None:
                early.stop()
        if verified is not None:
            why = wanted(cfg, verified)
            if why:
                recal = recalibrate(
                    cfg, r, inner_cal, tuned, found, results, verified, searches, why
                )  # fmt: skip
                if recal.results is not None:
                    adopt_rows(cfg, verified, recal, searches, *adopted_models(recal))
                    verified.update(summary(verified["configs"], cfg, verified["wall_time_s"]))
                    order = ranked(recal.results, cfg.tune.objective, metric, pct)
                    shared = recal.shared
        measured = {row["config_id"]: row for row in (verified or {}).get("configs", [])}
        frame = table(order, pct, shared, measured)
        if verified is not None:
            verified["spearman"] = rank_agreement(verified)
        doc = document(cfg, order, shared, verified, note, calibrated)
        doc["recalibration"] = None if recal is None else recal.record
        doc["calibrations"] = None if ensemble is None else ensemble.record
        doc.update(
            num_requests=len(lengths),
            sim_window=cfg.capacity.window_record(),
            simulated_wall_s=round(simulated_s, 1),
            wall_time_s=round(time.perf_counter() - started, 1),
        )
        write_outputs(r, cfg, doc, frame, metric)
    if cfg.progress:
        from gpu_simulate_test.tune.report import print_result

        print_result(doc, frame, r.path)
    if note:
        raise ConfigError(f"{note} (the table: {r.file(contract.TUNE_CSV)})")
    return r.path


def simulated(
    cfg: TuneStageConfig, tuned: TuneInputs, found: list[Candidate], metric: str, pct: int
) -> tuple[list[Simulated], float | None, list[Simulated], float, str]:
    """Every configuration simulated: the results, the shared rate, the ranking (by ``metric``
    at percentile ``pct`` where capacities tie), the seconds it took, and the note when no
    configuration meets the goals (else empty)."""
    t0 = time.perf_counter()
    with progress_bar("simulating configurations", len(found), cfg.progress) as advance:
        results, shared = simulate_space(tuned, found, advance)
    simulated_s = time.perf_counter() - t0
    order = ranked(results, cfg.tune.objective, metric, pct)
    if not any(score(s, cfg.tune.objective) > 0 for s in order if not s.error):
        return results, shared, order, simulated_s, no_configuration_note(order, cfg)
    return results, shared, order, simulated_s, ""


def no_configuration_note(order: list[Simulated], cfg: TuneStageConfig) -> str:
    """No configuration meets the goals: which goal binds at the lowest rate tried, and by how
    much, for the configuration that came closest."""
    valid = [s for s in order if not s.error and s.answer is not None]
    if not valid:
        return "no configuration of tune.space could be simulated: " + "; ".join(
            f"{s.candidate.config_id}: {s.error}" for s in order[:3]
        )
    lowest = [
        (s, min(s.answer.points, key=lambda p: p.qps))
        for s in valid
        if s.answer is not None and s.answer.points
    ]
    closest, point = min(lowest, key=lambda sp: (len(sp[1].violated), sp[1].qps))
    what = "; ".join(point.violated) or "the goals"
    return (
        f"no configuration meets the goals (capacity.slo) even at {point.qps:g} req/s; the "
        f"closest, {closest.candidate.config_id}, misses {what} there: loosen the goals or lower "
        "capacity.qps_min"
    )


def rank_agreement(verified: Mapping[str, Any]) -> float | None:
    pairs = [
        (row["simulated_qps"], row["measured_qps"])
        for row in verified["configs"]
        if row["simulated_qps"] is not None and row["measured_qps"] is not None
    ]
    value = spearman([a for a, _ in pairs], [b for _, b in pairs])
    return None if value is None else round(value, 3)


def document(
    cfg: TuneStageConfig,
    order: list[Simulated],
    shared: float | None,
    verified: dict[str, Any] | None,
    note: str,
    calibrated: Any,
) -> dict[str, Any]:
    """``tune.json``."""
    objective = cfg.tune.objective
    pct = cfg.capacity.slo.percentile
    metric = next(iter(cfg.capacity.slo.goals()))
    valid = [s for s in order if not s.error and score(s, objective) > 0]
    points = [
        (s.candidate.config_id, score(s, objective), latency_at(s, metric, pct))
        for s in valid
        if math.isfinite(latency_at(s, metric, pct))
    ]
    best = valid[0] if valid and not note else None
    target = None
    if cfg.tune.target_qps and not note:
        target = target_answer(order, cfg.tune.target_qps, served_name(cfg))
        best = next((s for s in valid if s.candidate.config_id == target["config_id"]), None)
    fleets = any(s.candidate.replicas > 1 for s in order)
    configured = next((s for s in order if s.candidate.configured), None)
    return {
        "schema_version": contract.TUNE_SCHEMA_VERSION,
        "objective": objective,
        "slo": {"percentile": pct, "goals_ms": cfg.capacity.slo.goals()},
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "backend": cfg.backend.name,
        "space": {name: list(values) for name, values in cfg.tune.knobs().items()},
        "configurations": len(order),
        "refused": sum(1 for s in order if s.error),
        "simulations": sum(s.simulations for s in order),
        "shared_rate_qps": shared,
        "calibrated_with": knobs_of(calibrated),
        "best": None
        if best is None
        else best_record(best.candidate, score(best, objective), served_name(cfg)),
        "target": target,
        "gpu_frontier": frontier(order) if fleets else None,
        "configured_score": None if configured is None else score(configured, objective),
        "sim_seeds": seeds_record(order, cfg.tune.sim_seeds, cfg.vidur.seed),
        "ranking": [s.candidate.config_id for s in order],
        "pareto": pareto(points),
        "note": note,
        "verify": verified,
    }


def best_record(candidate: Candidate, value: float, model: str) -> dict[str, Any]:
    return {
        "config_id": candidate.config_id,
        "knobs": dict(candidate.knobs),
        "replicas": candidate.replicas,
        "router": candidate.routed_by,
        "score": value,
        "flags": serve_flags(candidate.knobs),
        "deploy": deployment(candidate, model),
    }


def write_outputs(
    r: Run, cfg: TuneStageConfig, doc: dict[str, Any], frame: Any, metric: str
) -> None:
    """tune.csv, tune.json, the Pareto plot and report.md (the JSON before the report, the
    plot before either names it)."""
    from gpu_simulate_test.tune.plots import plot_tune
    from gpu_simulate_test.tune.report import report_markdown

    write_csv(r.file(contract.TUNE_CSV), frame, contract.TUNE_TABLE)
    plot_tune(
        frame,
        metric,
        cfg.capacity.slo.percentile,
        doc["pareto"],
        cfg.tune.objective,
        r.file(contract.TUNE_PLOT),
    )
    write_json(r.file(contract.TUNE_JSON), doc)
    with atomic_open(r.file(contract.REPORT_MD)) as handle:
        handle.write(report_markdown(r.run_id, doc, frame))
    best = doc.get("best") or {}
    r.update_meta(best=best.get("config_id"), verified=(doc.get("verify") or {}).get("mode"))
    if cfg.progress and doc.get("note"):
        console.print(f"[yellow]{doc['note']}")


def served_name(cfg: TuneStageConfig) -> str:
    """The model as ``vllm serve`` is given it: its Hugging Face name, else its short id."""
    return cfg.model.hf_name or cfg.model.name
