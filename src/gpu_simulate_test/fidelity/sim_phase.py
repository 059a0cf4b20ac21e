"""The fidelity campaign's sim phase: per load of a real phase's manifest, Vidur on the recorded
workload and arrivals with the same derived scheduler knobs, compare against the recorded real
run, then the error table, the latency-vs-load plot and ``report.md``. A bench_import run is
taken the same way, through the plan :mod:`.imported` builds from it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from gpu_simulate_test.compare.contract import (
    COMPARISON_JSON,
    COMPARISON_PERCENTILES,
    PERCENTILES_CSV,
)
from gpu_simulate_test.config.fidelity import FidelityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import OutputConfig
from gpu_simulate_test.core.metrics import window
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.core.run_inputs import load_run
from gpu_simulate_test.fidelity import contract, report
from gpu_simulate_test.fidelity import tables as fid
from gpu_simulate_test.fidelity.at_level import at_level_json
from gpu_simulate_test.fidelity.manifest import (
    PlannedLoad,
    load_plan,
    missing_loads,
    read_manifest,
)
from gpu_simulate_test.fidelity.real_phase import command
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import (
    ArtifactError,
    atomic_open,
    read_csv,
    read_json,
    write_csv,
    write_json,
)
from gpu_simulate_test.io.runs import Run, open_upstream_run, package_versions
from gpu_simulate_test.orchestrate.configs import recorded_pipeline
from gpu_simulate_test.orchestrate.profiling import older_calibration, recorded_plan
from gpu_simulate_test.orchestrate.step_level import at_real_step_level
from gpu_simulate_test.orchestrate.steps import simulate_and_compare
from gpu_simulate_test.orchestrate.truth import Truth

Levels = list[tuple[str, float, float, pd.DataFrame]]
"""(backend, load fraction, offered rate (req/s, sessions/s with sessions), that load's compare
percentiles)."""
Noise = dict[tuple[str, float], list[dict[tuple[str, str, str], float]]]
"""(backend, load fraction) → each repeated real run's (clock, metric, stat) percentiles (ms)."""
AtLevel = dict[tuple[str, float], tuple[dict[str, Any] | None, Path | None]]
"""(backend, load fraction) → its real run's step level and the compare run of the load simulated
at it (None, None: no level)."""


def sim_source(src: Path) -> dict[str, Any]:
    """A real phase's manifest, checked: a readable manifest of this version, at least one load;
    ``partial`` notes when it stopped part-way."""
    if not src.is_dir():
        raise ArtifactError(
            f"fidelity.real_from={src}: no such directory (expected a fidelity.phase=real run, "
            "tmp/fidelity/<run_id>, or a bench_import run, tmp/bench_import/<run_id>)"
        )
    manifest = read_manifest(src)
    notes = []
    if not manifest.get("complete", True):
        missing = missing_loads(manifest)
        notes.append(
            "the real phase stopped part-way: "
            + ", ".join(f"{b} without its last {n} load(s)" for b, n in missing.items())
        )
    if not load_plan(manifest):
        raise ArtifactError(
            f"{src / contract.MANIFEST_FILE}: the real phase stopped before its first load "
            "(complete: false, no loads): nothing to simulate"
        )
    meta = read_json(src / layout.RUN_META, required_keys=("stage", "status"))
    if meta["stage"] != "fidelity":
        raise ArtifactError(f"{src}: is a {meta['stage']} run, expected a fidelity run")
    return {"root": src, "manifest": manifest, "notes": notes}


def sim_config(
    cfg: FidelityStageConfig, recorded: Mapping[str, Any], where: Path
) -> PipelineStageConfig:
    """The real phase's pipeline config, with this run's simulation knobs (``vidur``,
    ``engine_overhead``, ``compare``): two models can meet one recorded truth."""
    real = recorded_pipeline(recorded, where)
    return dataclasses.replace(
        real,
        vidur=cfg.vidur,
        engine_overhead=cfg.engine_overhead,
        compare=cfg.compare,
        progress=cfg.progress,
    )


def sim_phase(cfg: FidelityStageConfig, r: Run, source: Mapping[str, Any], started: float) -> None:
    """Per load of the manifest: Vidur and compare (under ``r.path/runs``), then the report.
    ``source["config"]``, when there (an import), replaces the recorded config."""
    src: Path = source["root"]
    manifest = source["manifest"]
    notes = list(source["notes"])
    capacity: dict[str, dict[str, Any]] = {}
    levels: Levels = []
    noise: Noise = {}
    at_level: AtLevel = {}
    plots: dict[str, str] = {}
    real_runs = real_run_records(load_plan(manifest))
    if real_runs is not None:  # each backend's capacity probe first: every load's rate rests on it
        real_runs = probe_records(manifest) + real_runs
    if real_runs and any(run["disturbed"] and run["load_fraction"] is None for run in real_runs):
        notes.append(
            "the capacity probe was disturbed and kept after every re-run (see Real runs): "
            "every load's rate rests on it, so the loads may not be the fractions of capacity "
            "they are named"
        )
    if real_runs and any(r["disturbed"] for r in real_runs if r["load_fraction"] is not None):
        notes.append(
            "disturbed real run(s) kept after every re-run (see Real runs): their figures "
            "measure the host as much as the engine"
        )
    for backend, rec in manifest["backends"].items():
        sim_cfg = source.get("config") or sim_config(
            cfg, rec["config"], src / contract.MANIFEST_FILE
        )
        compare_dirs = [
            (load, simulate_load(cfg, sim_cfg, rec, load, src, r, noise, at_level))
            for load in load_plan(manifest)
            if load.backend == backend
        ]
        at_bundle = sim_cfg  # the bundle the real phase carried, where it says
        if carried := rec.get("profiling_root"):
            at_bundle = dataclasses.replace(sim_cfg, profiling_root=str(src / carried))
        if (older := older_calibration(at_bundle)) is not None:
            notes.append(older)
            console.print(f"[yellow]{older}")
        cap = dict(rec["capacity"])
        if cap.get("probe_run"):
            cap["probe_run"] = str(src / cap["probe_run"])
        capacity[backend], rows, plots[backend] = finish_backend(backend, cap, compare_dirs, r.path)
        for record in capacity[backend]["loads"]:  # each load's real run's own step level
            level, _ = at_level.get((backend, record["load_fraction"]), (None, None))
            record["real_step_level"] = level
        levels += rows
    notes += load_notes(capacity)
    setup = setup_record(cfg, r, source, notes, real_runs, started)
    table = fid.fidelity_rows(levels)
    if noise:
        table = fid.add_noise(table, noise)
    table = fid.add_at_level(
        table, {key: level_percentiles(d) for key, (_, d) in at_level.items() if d is not None}
    )
    write_report(r, setup, capacity, table, plots, cfg.progress)


def simulate_load(
    cfg: FidelityStageConfig,
    sim_cfg: PipelineStageConfig,
    rec: Mapping[str, Any],
    load: PlannedLoad,
    src: Path,
    r: Run,
    noise: Noise,
    at_level: AtLevel,
) -> Path:
    """One load: its repeats' percentiles into ``noise`` (the real-vs-real floor), then Vidur on
    its workload with the recorded scheduler (checked) and compare against its real run, under
    ``r.path/runs``; then the same at the real run's own step level, into ``at_level``
    (:func:`~gpu_simulate_test.orchestrate.step_level.at_real_step_level`); returns the compare
    run."""
    backend = load.backend
    if cfg.progress:
        console.rule(
            f"[bold]{backend}: {load.load_fraction:.0%} of capacity, "
            f"{load.offered_qps:.4g} {fid.rate_unit(rec['capacity'])} (simulated)"
        )
    repeats = [
        fid.real_percentiles(load_run(src / d, "real_bench").requests, warmup_s=load.warmup_s)
        for d in load.repeat_dirs
    ]
    if repeats:
        noise[(backend, load.load_fraction)] = repeats
    workload_dir = src / load.workload_dir
    real_dir = src / load.real_dir
    open_upstream_run(real_dir, "real_bench")
    root = src / (load.profiling_root or rec["profiling_root"])
    load_cfg = dataclasses.replace(
        sim_cfg,
        compare=dataclasses.replace(sim_cfg.compare, warmup_s=load.warmup_s),
        output=OutputConfig(
            root=str(r.file(contract.RUNS_DIR)), run_id=load.run_id, overwrite=True
        ),
        profiling_root=str(root),
        reuse_profile=True,  # the sim phase never profiles: the bundle must fit
    )
    # an import records no scheduler (empty): nothing to check, and the report says so
    decided = recorded_plan(
        load_cfg, workload_dir, load.scheduler, src / contract.MANIFEST_FILE, load.run_id
    )
    repeat, replaced = truth_beside(load, src)
    _, compare_dir = simulate_and_compare(
        load_cfg, decided.scheduler, workload_dir, real_dir, repeat_dir=repeat, replaced=replaced
    )
    at_level[(backend, load.load_fraction)] = at_real_step_level(
        load_cfg, decided.scheduler, workload_dir, real_dir, load.run_id
    )
    return compare_dir


def truth_beside(load: PlannedLoad, src: Path) -> tuple[Path | None, tuple[Path, ...]]:
    """What a load's compare sets beside its real run, as the pipeline's does: the truth's
    first repeat, and the disturbed attempts that re-runs replaced (those still under ``src``;
    a directory moved without them names none). Without them its summary read "no repeat of
    the truth" and "undisturbed" of a load whose repeat and re-runs the report counted."""
    repeat = src / load.repeat_dirs[0] if load.repeat_dirs else None
    replaced = tuple(
        src / a["real_dir"]
        for truth in load.truth
        for a in truth["attempts"][:-1]
        if (src / a["real_dir"]).is_dir()
    )
    return repeat, replaced


def level_percentiles(compare_dir: Path) -> dict[tuple[str, str, str], float]:
    """A load simulated at its real run's step level: each (clock, metric, stat)'s simulated
    milliseconds (:func:`clock_percentiles` of its compare run)."""
    percentiles = read_csv(compare_dir / PERCENTILES_CSV, COMPARISON_PERCENTILES)
    comparison = read_json(compare_dir / COMPARISON_JSON, required_keys=("offered_qps",))
    frame = clock_percentiles(percentiles, comparison)
    return {
        (str(rec.get("clock", "client")), str(rec["metric"]), str(rec["stat"])): float(
            rec["sim_ms"]
        )
        for rec in frame.to_dict("records")
    }


def load_notes(capacity: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the report says of loads the real engine did not sustain, or that were not yet a
    steady state."""
    notes = []
    unsustained = [
        f"{b} at {level['load_fraction']:.0%} (completion / arrival {level['completion_ratio']})"
        for b, cap in capacity.items()
        for level in cap["loads"]
        if not level["sustained"]
    ]
    if unsustained:
        notes.append(
            f"the real engine did not keep up (completion / arrival < {fid.SUSTAINED_RATIO}: its "
            "queue grew, the capacity was overrun, or too few requests to tell) at "
            + ", ".join(unsustained)
        )
    growing = [
        f"{b} at {level['load_fraction']:.0%} (queue trend {level['window']['queue_trend']})"
        for b, cap in capacity.items()
        for level in cap["loads"]
        if level["sustained"] and level["window"]["steady"] is False
    ]
    if growing:
        notes.append(
            f"not a steady state (the measured window's last third waited over "
            f"{window.STEADY_TREND}x its first third's TTFT: the queue was still growing) at "
            + ", ".join(growing)
        )
    return notes


def setup_record(
    cfg: FidelityStageConfig,
    r: Run,
    source: Mapping[str, Any],
    notes: list[str],
    real_runs: list[dict[str, Any]] | None,
    started: float,
) -> dict[str, Any]:
    """The report's ``setup``: how the real runs were made (from the manifest), the notes, and
    this phase's command, versions and wall time."""
    src: Path = source["root"]
    manifest = source["manifest"]
    versions = dict(manifest.get("versions", {}))
    versions["vidur"] = package_versions(("vidur",))["vidur"] or "not installed"
    return {
        "schema_version": contract.FIDELITY_SCHEMA_VERSION,
        "phase": cfg.fidelity.phase,
        "partial": bool(notes),
        "notes": notes,
        "command": manifest.get("command", "?")
        + ("" if src == r.path else f" (real) ; {command()}"),
        "date": manifest.get("date"),
        "device": manifest.get("device"),
        "driver": manifest.get("driver"),
        "torch_threads": manifest.get("torch_threads"),
        "versions": versions,
        "requests_per_load": manifest["requests_per_load"],
        "load_duration_s": manifest.get("load_duration_s", 0.0),
        "warmup_s": manifest.get("warmup_s", 0.0),
        "real_runs_per_load": 1 + max((len(p.repeat_dirs) for p in load_plan(manifest)), default=0),
        "load_fractions": manifest["load_fractions"],
        "real_runs": real_runs,
        **({} if src == r.path else {"real_from": str(src)}),
        **({"imported": source["imported"]} if source.get("imported") else {}),
        "wall_time_s": round(
            (0.0 if src == r.path else float(manifest.get("wall_time_s", 0.0)))
            + time.perf_counter()
            - started,
            1,
        ),
    }


def real_run_records(loads: list[PlannedLoad]) -> list[dict[str, Any]] | None:
    """Per real run of every load (the first and each repeat): its attempts and the verdict on
    them, for the report; None when the real phase predates the disturbance check."""
    if any(not load.truth for load in loads):
        return None
    return [
        run_record(load.backend, load.load_fraction, record)
        for load in loads
        for record in load.truth
    ]


def probe_records(manifest: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per backend whose capacity probe recorded its disturbance verdict (``capacity.truth``,
    none where the capacity was given or the real phase predates it): a real-run record as
    :func:`real_run_records` gives, its ``load_fraction`` None."""
    return [
        run_record(backend, None, record)
        for backend, rec in manifest["backends"].items()
        if (record := (rec.get("capacity") or {}).get("truth"))
    ]


def run_record(
    backend: str, load_fraction: float | None, record: Mapping[str, Any]
) -> dict[str, Any]:
    """One real run's record for the report, from its stored :class:`Truth`
    (``load_fraction`` None: the capacity probe)."""
    truth = Truth.from_dict(record)
    return {
        "backend": backend,
        "load_fraction": load_fraction,
        "run": truth.real_dir.name,
        "reruns": truth.reruns,
        "disturbed": truth.disturbed,
        "verdict": truth.describe(),
    }


def _ms(seconds: float | None) -> float:
    return float("nan") if seconds is None else float(seconds) * 1e3


def clock_percentiles(percentiles: pd.DataFrame, comparison: Mapping[str, Any]) -> pd.DataFrame:
    """A load's percentiles on both clocks: compare's (the client's clock) and, where the real
    run recorded the engine's own clock, ``comparison.json`` ``clocks`` (the engine's against
    the simulated engine's, without the front end the simulation adds)."""
    client = percentiles.assign(clock="client")
    engine = [
        {
            "clock": "engine",
            "metric": row["metric"],
            "stat": row["stat"],
            "real_ms": _ms(row["engine_s"]),
            "sim_ms": _ms(row["sim_engine_s"]),
        }
        for row in comparison.get("clocks") or ()
    ]
    return pd.concat([pd.DataFrame(engine), client], ignore_index=True) if engine else client


def load_record(
    compare_dir: Path, load: PlannedLoad
) -> tuple[dict[str, Any], dict[str, Any], pd.DataFrame]:
    """One load's row of the report (its sustained and steady-state checks over the measured
    window), comparison and percentiles on both clocks."""

    percentiles = read_csv(compare_dir / PERCENTILES_CSV, COMPARISON_PERCENTILES)
    comparison = read_json(compare_dir / COMPARISON_JSON, required_keys=("offered_qps",))
    real_dir = Path(read_json(compare_dir / layout.RUN_META)["config"]["real_run_dir"])
    req = load_run(real_dir, "real_bench").requests
    steady = window.steady_state(req, load.warmup_s)
    ratio = steady["completion_ratio"]
    ratio = float("nan") if ratio is None else float(ratio)
    record = {
        "load_fraction": load.load_fraction,
        "offered_qps": load.offered_qps,
        "num_requests": len(req),
        "realized_qps": round(float(comparison["offered_qps"]), 4),
        "completion_ratio": round(ratio, 3),
        "sustained": fid.is_sustained(ratio),
        "window": steady,
        "compare_run": str(compare_dir),
    }
    totals = (comparison.get("steps") or {}).get("totals")
    if totals:
        record["steps"] = fid.step_attribution(totals, comparison.get("host_memory"))
    return record, comparison, clock_percentiles(percentiles, comparison)


def finish_backend(
    backend: str,
    cap: dict[str, Any],
    compare_dirs: list[tuple[PlannedLoad, Path]],
    out: Path,
) -> tuple[dict[str, Any], Levels, str]:
    """The loads' records into ``cap``, the per-load percentiles and the latency-vs-load plot."""
    from gpu_simulate_test.capacity.contract import rate_axis
    from gpu_simulate_test.compare import plots
    from gpu_simulate_test.compare.sweep import SWEEP_STATS, X_LABELS, sweep_table

    levels: Levels = []
    runs, loads = [], []
    for load, compare_dir in compare_dirs:
        record, comparison, percentiles = load_record(compare_dir, load)
        loads.append(record)
        levels.append((backend, load.load_fraction, load.offered_qps, percentiles))
        # plotted at the load's offered rate, as the report's tables and fidelity.csv give it
        # (the comparison's own is the rate its arrivals realized: a short load's is noisy)
        at_offered = {**comparison, "offered_qps": load.offered_qps}
        runs.append((compare_dir, at_offered, percentiles[percentiles["clock"] == "client"]))
    cap["loads"] = loads
    plot = contract.plot_name(backend)
    unit = fid.rate_unit(cap)
    label = X_LABELS["offered_qps"] if unit == fid.REQUEST_UNIT else rate_axis(unit)
    plots.plot_sweep(sweep_table(runs, "offered_qps"), out / plot, label, SWEEP_STATS)
    return cap, levels, plot


def write_report(
    r: Run,
    setup: Mapping[str, Any],
    capacity: Mapping[str, Mapping[str, Any]],
    table: pd.DataFrame,
    plots: Mapping[str, str],
    progress: bool,
) -> None:
    """``fidelity.json``, ``fidelity.csv`` and ``report.md`` into the run, atomically each."""
    data = fid.fidelity_json(r.run_id, setup, capacity, table)
    if (at_level := at_level_json(table, capacity)) is not None:
        data["at_real_step_level"] = at_level
    write_csv(r.file(contract.FIDELITY_CSV), table, contract.FIDELITY_TABLE)
    write_json(r.file(contract.FIDELITY_JSON), data)
    with atomic_open(r.file(contract.REPORT_MD)) as handle:
        handle.write(report.markdown(r.run_id, setup, capacity, table, plots))
    worst = fid.largest_abs_error(fid.headline(table))
    r.update_meta(largest_abs_error=worst, partial=bool(setup.get("partial")))
    if progress:
        for line in report.terminal_verdict(setup, table):
            console.print(line)
        console.print(f"[bold]largest absolute error:[/] {report.largest_said(worst)}")
        if setup.get("partial"):
            console.print("[bold yellow]partial report:[/] " + "; ".join(setup["notes"]))
        console.print(f"[bold]report:[/] {r.file(contract.REPORT_MD)}")
