"""The fidelity campaign's real phase: the capacity probe, then per load the workload, a profile
when the bundle does not cover it, and the real bench (``fidelity.real_repeats`` times), all
through one served engine. The manifest is rewritten after every load, so a stopped real phase
keeps its loads. Never imports Vidur (the GPU machine's half of a split campaign).
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

from gpu_simulate_test.config.fidelity import FidelityOptions, FidelityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import nested_output
from gpu_simulate_test.core.model.device import environment
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.fidelity import contract
from gpu_simulate_test.fidelity import tables as fid
from gpu_simulate_test.fidelity.manifest import make_manifest, write_manifest
from gpu_simulate_test.io.runs import Run
from gpu_simulate_test.orchestrate.configs import as_resolved, with_workload
from gpu_simulate_test.orchestrate.probe import measure_capacity, probe_size
from gpu_simulate_test.orchestrate.profiling import carry_bundle, ensure_bundle, profile_plan
from gpu_simulate_test.orchestrate.serving import served
from gpu_simulate_test.orchestrate.steps import QUIET, make_workload
from gpu_simulate_test.orchestrate.truth import trusted_truth
from gpu_simulate_test.vidur_simulate import plan


def command() -> str:
    """The command line this campaign was started with, for its manifest and report."""
    return " ".join(["python -m gpu_simulate_test.cli.fidelity", *sys.argv[1:]])


def real_phase(cfg: FidelityStageConfig, r: Run, started: float) -> None:
    """Probe and loads, every run under ``r.path``; the manifest after the probe and after every
    load, complete at the end."""
    opts = cfg.fidelity
    env = environment()
    base = cfg.pipeline()
    runs = nested_output(cfg.output, r.file(contract.RUNS_DIR), overwrite=False)
    base = dataclasses.replace(base, output=runs)
    backend = base.backend.name
    # phase=real brings its bundle back with the run, and so does a campaign that calibrates
    # afresh (reuse_profile=false, the stage's default); otherwise the shared bundles are reused
    own_profiles = opts.phase == "real" or opts.calibrate_each_load or not base.reuse_profile
    profiling_root = r.file(contract.PROFILES_DIR) if own_profiles else Path(base.profiling_root)
    if opts.phase == "real" and base.reuse_profile and not opts.calibrate_each_load:
        # the shared bundle travels with the run, and is reused there when it covers the loads
        # (a GPU session profiles once for every stage: scripts/gpu_validate.sh)
        carry_bundle(base, profiling_root)
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
            command=command(),
            environment=env,
            requests_per_load=opts.num_requests,
            load_fractions=opts.loads,
            wall_time_s=round(time.perf_counter() - started, 1),
            backends={backend: record},
            complete=complete,
            load_duration_s=opts.load_duration_s,
            warmup_s=opts.warmup_s,
        )
        write_manifest(r.path, manifest)

    with served(base, r.path, r, purpose="the campaign") as at_server:
        if opts.capacity_qps:
            record["capacity"] = {
                "probe_requests": 0,
                "probe_ok": 0,
                "probe_run": None,
                "capacity_qps": opts.capacity_qps,
                "output_tokens_per_s": None,
            }
        else:
            n = probe_size(at_server, opts.probe_requests)
            if cfg.progress:
                console.rule(f"[bold]{backend}: capacity probe ({n} requests)")
            record["capacity"] = measure_capacity(
                at_server, f"{backend}-capacity", n, reruns=opts.reruns
            )
        capacity = float(record["capacity"]["capacity_qps"])
        unit = fid.rate_unit(record["capacity"])
        if cfg.progress:
            console.print(f"capacity {capacity:.4g} {unit}")
        levels = fid.load_levels(capacity, opts.loads)  # before the first load: a bad capacity
        save(complete=False)
        needs: plan.Requirements | None = None
        fresh = not base.reuse_profile  # the campaign's first load profiles, later ones reuse it
        for index, (fraction, qps) in enumerate(levels):
            if cfg.progress:
                console.rule(
                    f"[bold]{backend}: {fraction:.0%} of capacity, {qps:.4g} {unit} (real)"
                )
            load, needs = real_load(
                at_server, opts, index, fraction, qps, needs, fresh and index == 0
            )
            if cfg.progress:
                console.print(
                    f"{load['num_requests']} requests, {opts.load_duration_s:g} s of arrivals at "
                    f"least, the first {opts.warmup_s:g} s a warm-up left out of the figures"
                )
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
    run_id = f"{cfg.backend.name}-load{index}"
    own_bundle = opts.calibrate_each_load
    num_requests = opts.requests_at(qps)
    load_cfg = with_workload(cfg, run_id, num_requests=num_requests, qps=qps)
    workload_dir = make_workload(load_cfg)
    because = None
    if own_bundle:
        load_root = Path(load_cfg.profiling_root) / f"load{index}"
        load_cfg = dataclasses.replace(load_cfg, profiling_root=str(load_root))
        because = "fidelity.calibrate_each_load"
    elif fresh:
        because = "reuse_profile=false: the campaign calibrates at its start"
    # later loads reuse the campaign's bundle when it covers them (reuse_profile set for that)
    judged = dataclasses.replace(load_cfg, reuse_profile=True)
    decided = profile_plan(judged, workload_dir, covering=needs, because=because)
    # no validation replay: the campaign's loads judge this calibration, and the real phase
    # (the GPU machine's half) never simulates
    ensure_bundle(
        dataclasses.replace(load_cfg, validate_calibration=False), decided, workload_dir, QUIET
    )
    truths = [
        trusted_truth(
            load_cfg,
            workload_dir,
            run_id=run_id if k == 1 else f"{run_id}-r{k}",
            reruns=opts.reruns,
        )
        for k in range(1, opts.real_repeats + 1)
    ]
    real_dirs = [t.real_dir for t in truths]
    load: dict[str, Any] = {
        "load_fraction": fraction,
        "offered_qps": qps,
        "num_requests": num_requests,
        "warmup_s": opts.warmup_s,
        "run_id": run_id,
        "workload_dir": str(workload_dir),
        "real_dir": str(real_dirs[0]),
        "repeat_dirs": [str(d) for d in real_dirs[1:]],
        "scheduler": dataclasses.asdict(decided.scheduler),
        "truth": [t.to_dict() for t in truths],
        "disturbed_runs": sum(a.disturbed for t in truths for a in t.attempts),
    }
    if own_bundle:
        load["profiling_root"] = load_cfg.profiling_root
    return load, decided.needs
