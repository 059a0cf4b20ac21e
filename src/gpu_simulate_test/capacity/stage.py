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
   judged against the same goals, next to what the simulation predicted there; or
   (``verify=search``) the capacity measured on the real engine (:mod:`.real_search`), seeded at
   the simulated answer, with the real rates simulated too where the search had not.

A multi-turn workload's rate is sessions/s (:mod:`.sessions`): only each session's turn 0 has an
arrival to scale; its later turns follow in the simulation's closed loop, and each rate is also
given in requests finished per second and concurrent users.

Writes ``capacity.csv``, ``capacity.json``, ``capacity.png`` and ``report.md``
(:mod:`.contract`) into ``<output.root>/capacity/<run_id>/``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from gpu_simulate_test.capacity import contract
from gpu_simulate_test.capacity.band import band_record, in_band
from gpu_simulate_test.capacity.real_search import (
    RealSearch,
    check_real_sessions,
    rates_to_simulate,
    real_search,
    search_record,
)
from gpu_simulate_test.capacity.report import print_result, report_markdown
from gpu_simulate_test.capacity.search import (
    METRICS,
    Answer,
    Point,
    binding,
    judge,
    judged_point,
    search,
)
from gpu_simulate_test.capacity.seeds import median_seed, seeds_record
from gpu_simulate_test.capacity.sessions import (
    REQUEST_UNIT,
    SESSION_UNIT,
    SessionCurve,
    SessionLoad,
    rate_unit,
    session_load,
)
from gpu_simulate_test.capacity.split import (
    REFERENCE_QPS,
    RealSource,
    bundle_and_workload,
    per_engine_requests,
    read_real,
    recorded_inputs,
    write_real,
)
from gpu_simulate_test.config.capacity import CapacityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import nested_output
from gpu_simulate_test.config.search import SearchOptions
from gpu_simulate_test.config.vidur import VidurSimulateStageConfig, derived_seed
from gpu_simulate_test.core.metrics.goodput import rate_of, table_goodput
from gpu_simulate_test.core.metrics.percentiles import LATENCY_PERCENTILES, latency_ms
from gpu_simulate_test.core.reporting import console, progress_bar
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io.artifacts import atomic_open, write_csv, write_json
from gpu_simulate_test.io.runs import Run, default_run_id, start_run
from gpu_simulate_test.orchestrate.configs import as_resolved, simulate_config, with_workload
from gpu_simulate_test.orchestrate.profiling import ProfilePlan, older_calibration
from gpu_simulate_test.orchestrate.serving import served
from gpu_simulate_test.orchestrate.steps import check_trace, make_workload, run_truth

if TYPE_CHECKING:
    from gpu_simulate_test.simulator.step_model import StepModel
    from gpu_simulate_test.vidur_simulate.inputs import Inputs


def run(cfg: CapacityStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """The search into ``<output.root>/capacity/<run_id>/``; returns the run directory."""
    opts = cfg.capacity
    goals, pct = opts.slo.goals(), opts.slo.percentile
    # phase=sim: the real phase's run checked before the run directory exists (its bundle's
    # coverage and scheduler once the run has begun)
    source = read_real(Path(opts.real_from).resolve(), cfg) if opts.real_from else None
    if source is None:  # a bad trace refused before the run exists
        check_trace(cfg.workload, cfg.model)
    if opts.verify != "false" and source is None:  # sessions on the real engine: refused now
        check_real_sessions(cfg)
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    read_from = [opts.real_from] if opts.real_from else []
    with start_run(
        cfg.output.root, "capacity", run_id, resolved_config, cfg.output.overwrite, read_from
    ) as r:
        started = time.perf_counter()
        r.update_meta(phase=opts.phase)
        output = nested_output(cfg.output, r.file(contract.RUNS_DIR))
        inner = dataclasses.replace(cfg.pipeline(), output=output, progress=False)
        if source is not None:
            inner, decided, workload_dir = recorded_inputs(cfg, inner, source)
            older = older_calibration(inner)  # simulated with it, said
            r.update_meta(
                real_from=str(source.root), recorded_config=as_resolved(inner),
                older_calibration=older,
            )  # fmt: skip
            if older is not None:
                console.print(f"[yellow]{older}")
            # the report names the engine and device the real phase measured
            cfg = dataclasses.replace(
                cfg, model=inner.model, hardware=inner.hardware, backend=inner.backend
            )
        else:
            inner = per_engine_requests(cfg, inner)
            inner, decided, workload_dir = bundle_and_workload(cfg, inner, r)
        if opts.phase == "real":  # the GPU machine's half: the real search, no Vidur
            return real_phase(cfg, inner, r, decided, workload_dir)
        from gpu_simulate_test.vidur_simulate.stage import prepare

        sim_cfg = simulate_config(inner, decided.scheduler, workload_dir)
        # each rate reads the request table alone: no per-batch log; the fleet's router as
        # asked (a recorded real run's: its data-parallel server's)
        sim_cfg = dataclasses.replace(
            sim_cfg,
            vidur=dataclasses.replace(sim_cfg.vidur, step_log=False),
            fleet=sim_cfg.fleet if source is not None else cfg.fleet_of(),
        )
        inputs = prepare(sim_cfg)
        num_requests = len(inputs.arrival_time_s)
        r.update_meta(
            workload_dir=str(workload_dir),
            num_requests=num_requests,
            scheduler=dataclasses.asdict(decided.scheduler),
            bundle=str(inputs.bundle.path),
            slo={"percentile": pct, "goals_ms": goals},
            fleet=dataclasses.asdict(sim_cfg.fleet),
        )
        from gpu_simulate_test.vidur_simulate.stage import step_model_of

        model = step_model_of(sim_cfg, inputs, r.file(contract.POINTS_DIR))
        found = simulated_searches(cfg, sim_cfg, inputs, r, model)
        answers, sessions = found.answers, found.sessions
        answer = answers[0]
        band = band_record(opts.step_band, *answers) if len(answers) == 3 else None
        unit = REQUEST_UNIT if sessions is None else SESSION_UNIT
        at_cfg, at_inputs = found.chosen_cfg, found.chosen_inputs

        def simulate_at(qps: float) -> Point:
            """The simulated search's evaluation at a rate it did not run (a real one), under
            the seed that answered."""
            where = r.file(contract.POINTS_DIR)
            return simulated_rate(at_cfg, at_inputs, qps, "real-rate", where, opts, model)[0]

        verified, measured = check_answer(cfg, inner, answer, band, source, r, unit, simulate_at)
        doc = write_outputs(
            r,
            cfg,
            answer,
            verified,
            num_requests,
            time.perf_counter() - started,
            measured,
            band,
            sessions,
            found.seeds,
        )
    if cfg.progress:
        print_result(doc, r.path)
    return r.path


def real_phase(
    cfg: CapacityStageConfig,
    inner: PipelineStageConfig,
    r: Run,
    decided: ProfilePlan,
    workload_dir: Path,
) -> Path:
    """``phase=real`` (the GPU machine's half): the real search, its curve, then the hand-off
    for the sim phase; no Vidur."""
    found = real_search(cfg, inner, r)
    root = Path(inner.profiling_root)
    write_csv(
        r.file(contract.CAPACITY_REAL_CSV),
        points_frame(found.measured.points),
        contract.CAPACITY_TABLE,
    )  # the manifest last: the sim phase reads a run that got that far, and finished
    manifest = write_real(r, cfg, root, workload_dir, decided, found)
    measured = found.measured.qps
    r.update_meta(measured_capacity_qps=measured, workload_dir=str(workload_dir))
    if cfg.progress:
        unit = rate_unit(load_workload(workload_dir).sessions)
        said = "none" if measured is None else f"{measured:g} {unit}"
        console.print(
            f"[bold]measured capacity:[/] {said}; [bold]manifest:[/] {manifest}; "
            f"simulate with capacity.phase=sim capacity.real_from={r.path}"
        )
    return r.path


def at_rate(inputs: Inputs, qps: float) -> Inputs:
    """The one workload at ``qps``: its arrivals scaled by ``REFERENCE_QPS / qps`` (the workload
    stage's gaps are ``scale × standard draws``). A multi-turn workload's later turns have no
    arrival (NaN, and NaN they stay): they follow their session's previous answer after its think
    time (``inputs.after``, the simulation's closed loop), which no rate scales."""
    return dataclasses.replace(inputs, arrival_time_s=inputs.arrival_time_s * (REFERENCE_QPS / qps))


@dataclass(frozen=True)
class Searched:
    """The simulated searches: the answer (the median seed's) and, with ``capacity.step_band``,
    the slower and the faster one; a multi-turn search's curve in sessions; the seeds' record
    (None: one seed) and the simulation config and inputs of the seed that answered."""

    answers: list[Answer]
    sessions: SessionCurve | None
    seeds: dict[str, Any] | None
    chosen_cfg: VidurSimulateStageConfig
    chosen_inputs: Inputs


def simulated_searches(
    cfg: CapacityStageConfig,
    sim_cfg: VidurSimulateStageConfig,
    inputs: Inputs,
    r: Run,
    model: StepModel | None = None,
) -> Searched:
    """The search by simulation (:mod:`.search`), each rate the one workload's arrivals scaled
    (:func:`at_rate`), once per noise seed (``capacity.sim_seeds``: the median seed's answers,
    :mod:`.seeds`; a later seed's points under ``points/seed-<seed>/``); with
    ``capacity.step_band``, again under the answering seed with every step ``1 ± step_band`` as
    long (the band). With sessions, the answering search's rates in requests and users too."""
    from gpu_simulate_test.vidur_simulate.stage import prepare

    opts = cfg.capacity
    sessions = inputs.workload.sessions
    request_ids = inputs.workload.lengths["request_id"].to_numpy()
    scales = [1.0 + opts.step_band, 1.0 - opts.step_band] if opts.step_band else []
    total = (opts.points + opts.refine + opts.extend) * (opts.sim_seeds + len(scales))
    first_seed = sim_cfg.vidur.seed
    with progress_bar("simulating rates", total, cfg.progress) as advance:

        def searched(
            at: VidurSimulateStageConfig, at_inputs: Inputs, where: Path, loads: dict | None
        ) -> Answer:
            def evaluate(qps: float, phase: str) -> Point:
                point, table = simulated_rate(at, at_inputs, qps, phase, where, opts, model)
                advance(1)
                if sessions is not None and loads is not None:
                    loads[qps] = session_load(qps, table, request_ids, sessions)
                return point

            return search(
                evaluate, opts.qps_min, opts.qps_max, opts.points, opts.refine, opts.extend,
                unit=rate_unit(sessions),
            )  # fmt: skip

        runs: list[tuple[Answer, VidurSimulateStageConfig, Inputs, dict[float, SessionLoad]]] = []
        for k in range(opts.sim_seeds):
            seed = derived_seed(first_seed, k)
            seeded = dataclasses.replace(
                sim_cfg, vidur=dataclasses.replace(sim_cfg.vidur, seed=seed)
            )
            seeded_inputs = inputs if k == 0 else prepare(seeded)  # the seed's draws
            where = r.file(contract.POINTS_DIR)
            if k:
                where = where / f"seed-{seed}"
            loads: dict[float, SessionLoad] = {}
            found = searched(seeded, seeded_inputs, where, loads)
            runs.append((found, seeded, seeded_inputs, loads))
        chosen = median_seed([run[0] for run in runs])
        answer, chosen_cfg, chosen_inputs, chosen_loads = runs[chosen]
        answers = [answer]
        for scale in scales:  # the band's searches: points/steps-x1.1/<qps>
            scaled = dataclasses.replace(
                chosen_cfg, vidur=dataclasses.replace(chosen_cfg.vidur, step_time_scale=scale)
            )
            where = r.file(contract.POINTS_DIR) / f"steps-x{scale:g}"
            answers.append(searched(scaled, chosen_inputs, where, None))
    record = None
    if opts.sim_seeds > 1:
        record = seeds_record([run[0] for run in runs], first_seed, chosen)
    curve = None if sessions is None else SessionCurve(sessions.num_sessions, chosen_loads)
    return Searched(answers, curve, record, chosen_cfg, chosen_inputs)


def simulated_rate(
    sim_cfg: VidurSimulateStageConfig,
    inputs: Inputs,
    qps: float,
    phase: str,
    points_dir: Path | None,
    opts: SearchOptions,
    step_model: StepModel | None = None,
) -> tuple[Point, Any]:
    """One simulated rate (``points/<qps>``; None: in memory), judged by the goals; and its
    request table. With ``capacity.sim_window`` only the requests the real search replays at
    ``qps``. ``step_model``: the one the caller built for this configuration (None: built)."""
    from gpu_simulate_test.vidur_simulate.inputs import first_requests
    from gpu_simulate_test.vidur_simulate.stage import simulate_inputs

    t0 = time.perf_counter()
    if opts.sim_window:
        inputs = first_requests(inputs, opts.requests_at(qps))
    where = None if points_dir is None else points_dir / f"{qps:g}"
    table = simulate_inputs(sim_cfg, at_rate(inputs, qps), where, step_model).table
    return judged_point(qps, phase, table, opts.slo, time.perf_counter() - t0), table


def check_answer(
    cfg: CapacityStageConfig,
    inner: PipelineStageConfig,
    answer: Answer,
    band: dict[str, Any] | None,
    source: RealSource | None,
    r: Run,
    unit: str = REQUEST_UNIT,
    simulate_at: Callable[[float], Point] | None = None,
) -> tuple[dict[str, Any] | None, Answer | None]:
    """``capacity.verify``: the answer on the real engine (``answer``), or the real search beside
    the simulated one (``search``: run here, seeded at the answer, or the real phase's,
    recorded); the record and the real search's answer (None when none ran). ``simulate_at``
    simulates the real rates the simulated search did not run, for the latency agreement."""
    opts = cfg.capacity
    goals, pct = opts.slo.goals(), opts.slo.percentile
    if opts.verify == "answer":
        return verify(cfg, inner, answer, goals, pct, r, unit), None
    if opts.verify != "search":
        return None, None
    found: RealSearch = (
        source.found if source is not None else real_search(cfg, inner, r, answer.qps)
    )
    extra: tuple[Point, ...] = ()
    if simulate_at is not None:  # the simulated latency at every real rate
        extra = tuple(simulate_at(qps) for qps in rates_to_simulate(answer, found))
    keys = tuple(f"{metric}_p{pct}" for metric in goals)
    verified = search_record(answer, found, keys, extra)
    narrow = verified["bracket_narrow"]  # a wide bracket's low end is no capacity to judge
    verified["measured_in_band"] = in_band(found.measured.qps, band) if narrow else None
    return verified, found.measured


def verify(
    cfg: CapacityStageConfig,
    inner: PipelineStageConfig,
    answer: Answer,
    goals: Mapping[str, float],
    pct: int,
    r: Run,
    unit: str = REQUEST_UNIT,
) -> dict[str, Any] | None:
    """The workload at the answer's rate on the real engine (one served engine, recorded in
    ``r``): its percentiles, the goals' verdict and the simulation's prediction there. None
    without an answer."""
    if answer.qps is None:
        return None
    from gpu_simulate_test.core.run_inputs import load_run

    if cfg.progress:
        console.rule(
            f"[bold]checking {answer.qps:g} {unit} on the real engine ({inner.backend.name})"
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
    sessions: SessionCurve | None = None,
    seeds: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """capacity.csv, capacity.json, the plot and report.md (and, after a real search, its
    curve in capacity_real.csv); returns the JSON document. ``sessions``: a multi-turn search's
    (its rates in sessions/s, each also in requests and users)."""
    from gpu_simulate_test.capacity.plots import plot_capacity

    frame = points_frame(answer.points)  # the band's searches are in capacity.json alone
    if sessions is not None:
        frame = sessions.columns(frame)
    write_csv(r.file(contract.CAPACITY_CSV), frame, contract.CAPACITY_TABLE)
    real_frame = None
    if measured is not None:
        real_frame = points_frame(measured.points)
        write_csv(r.file(contract.CAPACITY_REAL_CSV), real_frame, contract.CAPACITY_TABLE)
    sim_s = float(frame["sim_wall_s"].sum())
    slo = cfg.capacity.slo
    unit = REQUEST_UNIT if sessions is None else SESSION_UNIT
    doc = {
        "schema_version": contract.CAPACITY_SCHEMA_VERSION,
        "answer_qps": answer.qps,
        "rate_unit": unit,
        "bracket_qps": list(answer.bracket),
        "note": answer.note,
        "slo": {"percentile": slo.percentile, "goals_ms": slo.goals()},
        "binding": binding(answer),
        "step_band": band,
        "sim_seeds": seeds,
        "num_requests": num_requests,
        "sim_window": cfg.capacity.window_record(),
        "model": cfg.model.name,
        "hardware": cfg.hardware.name,
        "backend": cfg.backend.name,
        "fleet": dataclasses.asdict(cfg.fleet_of()),
        "points": len(frame),
        "simulated_requests_per_s": round(num_requests * len(frame) / sim_s, 1) if sim_s else None,
        "wall_time_s": round(wall_s, 1),
        "verify": verified,
    }
    if sessions is not None:
        doc["sessions"] = sessions.record(answer.qps)
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
        unit,
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
