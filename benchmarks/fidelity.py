"""Fidelity harness: capacity, three loads real + simulated, one table (docs/fidelity.md).

Run: ``python -m benchmarks.fidelity --preset cpu_tiny|cpu_0_6b|gpu_0_6b
[--backend hf_cb|hf_generate|vllm|both] [--name NAME] [--out benchmarks/results]``. Per
backend: an all-at-once burst replayed for real gives the capacity (max sustainable requests/s
for the preset's fixed length mix); then the pipeline (workload → profile, reused when it fits →
Vidur → real bench → compare) runs at 20%, 50% and 85% of it with the same seeded workload (a
vLLM backend: one server for all of it). Writes ``<name>-fidelity.md``,
``<name>-fidelity.json`` and ``<name>-<backend>-latency-vs-load.png`` into ``--out``; the
stages' run directories stay in ``tmp/<stage>/<name>-<backend>-*``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import functools
import importlib.metadata
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from gpu_simulate_test.analysis import fidelity as fid
from gpu_simulate_test.analysis.inputs import load_run
from gpu_simulate_test.analysis.knobs import derive_scheduler
from gpu_simulate_test.analysis.schemas import COMPARISON_PERCENTILES
from gpu_simulate_test.config.compare import CompareStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.registry import CONFIG_DIR, register_configs, to_typed
from gpu_simulate_test.config.schema import ArrivalConfig, OutputConfig
from gpu_simulate_test.config.vidur import (
    VidurSchedulerConfig,
    VidurSimulateStageConfig,
)
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import (
    as_stored_json,
    atomic_open,
    read_csv,
    read_json,
    write_json,
)
from gpu_simulate_test.pipeline.run import (
    bundle_misfits,
    profile_config,
    simulation_vidur,
    stage_configs,
)
from gpu_simulate_test.pipeline.run import run as pipeline_run
from gpu_simulate_test.reporting import console
from gpu_simulate_test.vidur_ext import plan

BACKENDS: tuple[str, ...] = ("hf_cb", "hf_generate", "vllm")


@dataclass(frozen=True)
class Preset:
    """A model/device/length mix, and how many requests the probe and each load replay."""

    overrides: tuple[str, ...]
    """Hydra overrides of the ``pipeline`` config shared by both backends."""
    backend_overrides: dict[str, tuple[str, ...]]
    probe_requests: dict[str, int]
    """Requests in the all-at-once capacity burst, per backend (≥ 2× the batch cap for hf_cb,
    so the engine runs at its cap for most of the burst)."""
    num_requests: int
    """Requests per load level (same seed, so the same lengths at every level)."""
    real_repeats: int = 1
    """Real bench runs per load on the same workload; from 2 on, the report carries the real
    side's run-to-run difference (the noise floor) next to the simulator's error."""
    torch_threads: int = 0
    """torch's intra-op threads for every stage of the run (0: torch's default)."""
    calibrate_each_load: bool = False
    """Profile and calibrate right before every load's real run (its own bundle) instead of once
    per backend: on a host whose speed drifts, the calibration then sees the real run's moment."""


PRESETS: dict[str, Preset] = {
    # tiny Qwen3 on CPU: short requests, a few minutes for both backends on 2 cores
    "cpu_tiny": Preset(
        overrides=(
            "model=qwen3_tiny",
            "hardware=cpu",
            "workload.prompt_len.min=16",
            "workload.prompt_len.max=64",
            "workload.output_len.min=4",
            "workload.output_len.max=16",
        ),
        backend_overrides={
            "hf_cb": (
                "backend.max_batch_tokens=256",
                "backend.max_requests_per_batch=8",
                "backend.num_blocks=512",
            ),
            "hf_generate": (),
            # the pipeline's vLLM defaults: 256 tokens / 32 requests a step, 256 blocks of 32
            "vllm": (),
        },
        # 16 requests per load left the real percentiles to chance (one run's TTFT p50 at 50%
        # moved 25 -> 63 ms between two identical runs); 64 keeps a run near 3 minutes
        probe_requests={"hf_cb": 64, "hf_generate": 16, "vllm": 96},
        num_requests=64,
        real_repeats=2,  # the noise floor: on a shared 2-core machine it is not small
        # with torch on both cores, the engine's matmuls, the harness's replay and collector
        # threads and the OS fight over them: two identical hf_cb runs differed by 13.6% at the
        # median row and up to 48%; on one thread, by 4.4% and up to 11% (and faster)
        torch_threads=1,
    ),
    # Qwen3-0.6B on an H100, bf16, hf_cb 512 tokens / 32 requests / 4096 blocks, eager
    "gpu_0_6b": Preset(
        overrides=("+experiment=fidelity_qwen3_0_6b_h100",),
        backend_overrides={"hf_cb": (), "hf_generate": ()},
        probe_requests={"hf_cb": 96, "hf_generate": 8},
        num_requests=48,
    ),
}


def compose_config(overrides: list[str]) -> tuple[PipelineStageConfig, dict[str, Any]]:
    """The pipeline's typed config and its resolved dict, composed from the project's YAML."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="pipeline", overrides=overrides)
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    return to_typed(cfg, PipelineStageConfig), {str(k): v for k, v in resolved.items()}


def with_load(
    cfg: PipelineStageConfig, resolved: dict[str, Any], run_id: str, **workload: Any
) -> tuple[PipelineStageConfig, dict[str, Any]]:
    """``cfg`` with other workload fields and run id (overwriting), and the resolved dict to
    match (it is recorded as provenance in every run)."""
    new = dataclasses.replace(
        cfg,
        workload=dataclasses.replace(cfg.workload, **workload),
        output=dataclasses.replace(cfg.output, run_id=run_id, overwrite=True),
    )
    res = as_stored_json(resolved)
    res["workload"] = dataclasses.asdict(new.workload)
    res["output"] = dataclasses.asdict(new.output)
    return new, res


def measure_capacity(
    cfg: PipelineStageConfig, resolved: dict[str, Any], run_id: str, probe_requests: int
) -> dict[str, Any]:
    """Replay an all-at-once burst for real; capacity by :func:`fid.burst_capacity`."""
    from gpu_simulate_test.real_bench.stage import run as real_bench_run
    from gpu_simulate_test.workloads.build import run as workload_run

    probe, res = with_load(
        cfg,
        resolved,
        run_id,
        num_requests=probe_requests,
        arrival=ArrivalConfig(process="all_at_once"),
    )
    workload_cfg, real_bench_cfg = stage_configs(probe, run_id)
    workload_dir = workload_run(workload_cfg, res)
    real_cfg = real_bench_cfg(str(workload_dir))
    real_dir = real_bench_run(real_cfg, dataclasses.asdict(real_cfg))
    req = load_run(real_dir, "real_bench").requests
    ok = (req["status"] == "ok").to_numpy()
    capacity = fid.burst_capacity(req["arrival_time_s"], req["e2e_s"], ok)
    span = float((req["arrival_time_s"] + req["e2e_s"])[ok].max() - req["arrival_time_s"].min())
    return {
        "probe_requests": probe_requests,
        "probe_ok": int(ok.sum()),
        "probe_run": str(real_dir),
        "capacity_qps": round(capacity, 4),
        "output_tokens_per_s": round(float(req.loc[ok, "num_decode_tokens"].sum()) / span, 2),
    }


def backend_overrides(preset: Preset, backend: str) -> list[str]:
    """The Hydra overrides of one backend's pipeline config (no output or profiling roots)."""
    fresh = ["reuse_profile=false"] if preset.calibrate_each_load else []
    return [*preset.overrides, f"backend={backend}", *preset.backend_overrides[backend], *fresh]


def load_record(
    compare_dir: Path, fraction: float, qps: float
) -> tuple[dict[str, Any], dict[str, Any], pd.DataFrame]:
    """One load's row of the report (with its sustained check), comparison and percentiles."""
    percentiles = read_csv(compare_dir / "percentiles.csv", COMPARISON_PERCENTILES)
    comparison = read_json(compare_dir / "comparison.json", required_keys=("offered_qps",))
    real_dir = Path(read_json(compare_dir / "run_meta.json")["config"]["real_run_dir"])
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


Noise = dict[tuple[str, float], list[dict[tuple[str, str], float]]]
"""(backend, load fraction) → each repeated real run's goal percentiles (ms)."""


def repeat_noise(backend: str, fraction: float, repeat_dirs: list[Path]) -> Noise:
    runs = [fid.real_percentiles(load_run(d, "real_bench").requests) for d in repeat_dirs]
    return {(backend, fraction): runs} if runs else {}


def repeat_real(load_cfg: PipelineStageConfig, run_id: str, workload_dir: Path, k: int) -> Path:
    """The real bench once more on the load's workload, as ``<run_id>-r<k>``."""
    from gpu_simulate_test.real_bench.stage import run as real_bench_run

    _, real_bench_cfg = stage_configs(load_cfg, f"{run_id}-r{k}")
    real_cfg = real_bench_cfg(str(workload_dir))
    return real_bench_run(real_cfg, dataclasses.asdict(real_cfg))


def finish_backend(
    backend: str,
    name: str,
    out: Path,
    cap: dict[str, Any],
    compare_dirs: list[tuple[float, float, Path]],
    noise: Noise | None = None,
) -> tuple[dict[str, Any], list[tuple[str, float, float, pd.DataFrame]], str, Noise]:
    """The loads' records into ``cap``, the per-load percentiles, the latency-vs-load plot and
    the noise floor (repeated real runs, if any)."""
    from gpu_simulate_test.analysis import plots
    from gpu_simulate_test.analysis.sweep import SWEEP_STATS, X_LABELS, sweep_table

    levels, runs, loads = [], [], []
    for fraction, qps, compare_dir in compare_dirs:
        record, comparison, percentiles = load_record(compare_dir, fraction, qps)
        loads.append(record)
        levels.append((backend, fraction, qps, percentiles))
        runs.append((compare_dir, comparison, percentiles))
    cap["loads"] = loads
    plot = f"{name}-{backend}-latency-vs-load.png"
    plots.plot_sweep(
        sweep_table(runs, "offered_qps"), out / plot, X_LABELS["offered_qps"], SWEEP_STATS
    )
    return cap, levels, plot, dict(noise or {})


@contextlib.contextmanager
def one_server(overrides: list[str], name: str) -> Iterator[list[str]]:
    """For the vLLM backend: start one server for the whole campaign (probe, calibration, every
    load and repeat: a start costs about a minute on 2 CPU cores) and yield the overrides that
    point every stage at it; its log lands in ``tmp/fidelity_servers/<name>/``. Yields no
    overrides for other backends. The server is stopped by pid on the way out, whatever
    happened."""
    cfg, _ = compose_config([*overrides, "progress=false"])
    if cfg.backend.name != "vllm" or cfg.backend.server.kind != "vllm":
        yield []
        return
    from gpu_simulate_test.real_bench.backends.vllm import VllmBackend

    _, real_bench_cfg = stage_configs(cfg, name)
    backend = VllmBackend(real_bench_cfg("(fidelity campaign)"))
    backend.log_dir = Path(cfg.output.root) / "fidelity_servers" / name
    backend.log_dir.mkdir(parents=True, exist_ok=True)
    console.print("starting one vLLM server for the campaign")
    try:
        backend.start_server()
        yield [
            "backend.server.kind=external",
            f"backend.base_url={backend.base_url}",
            f"backend.served_model_name={cfg.model.name}",
            f"backend.server.log_file={backend.log_path}",
        ]
    finally:
        backend.stop_server()


def run_backend(
    preset: Preset, backend: str, name: str, out: Path
) -> tuple[dict[str, Any], list[tuple[str, float, float, pd.DataFrame]], str, Noise]:
    """Capacity, then the three loads real + simulated; returns the capacity record, the
    per-load percentiles and the plot's file name."""
    with one_server(backend_overrides(preset, backend), f"{name}-{backend}") as served:
        return _run_backend(preset, backend, name, out, served)


def _run_backend(
    preset: Preset, backend: str, name: str, out: Path, served: list[str]
) -> tuple[dict[str, Any], list[tuple[str, float, float, pd.DataFrame]], str, Noise]:
    cfg, resolved = compose_config([*backend_overrides(preset, backend), *served, "progress=false"])
    console.rule(f"[bold]{backend}: capacity probe ({preset.probe_requests[backend]} requests)")
    cap = measure_capacity(
        cfg, resolved, f"{name}-{backend}-capacity", preset.probe_requests[backend]
    )
    console.print(f"capacity {cap['capacity_qps']:.3g} req/s ({cap['output_tokens_per_s']} tok/s)")
    compare_dirs = []
    noise: Noise = {}
    for index, (fraction, qps) in enumerate(fid.load_levels(cap["capacity_qps"])):
        console.rule(f"[bold]{backend}: {fraction:.0%} of capacity, {qps:.4g} req/s")
        run_id = f"{name}-{backend}-load{index}"
        load_cfg, res = with_load(cfg, resolved, run_id, num_requests=preset.num_requests, qps=qps)
        compare_dirs.append((fraction, qps, pipeline_run(load_cfg, res)))
        workload_dir = layout.run_dir(load_cfg.output.root, "workload", run_id)
        repeats = [
            repeat_real(load_cfg, run_id, workload_dir, k)
            for k in range(2, preset.real_repeats + 1)
        ]
        noise.update(repeat_noise(backend, fraction, repeats))
    return finish_backend(backend, name, out, cap, compare_dirs, noise)


def scheduler_needs(
    cfg: PipelineStageConfig, workload_dir: Path
) -> tuple[VidurSchedulerConfig, plan.Requirements]:
    """The Vidur scheduler derived from the backend and what the workload asks of the bundle,
    as the pipeline decides them (no Vidur import)."""
    from gpu_simulate_test.workloads.build import load_workload

    prefill, decode = plan.workload_lengths(load_workload(workload_dir).lengths)
    scheduler, _ = derive_scheduler(cfg.backend, cfg.vidur.scheduler, int(prefill.max()))
    return scheduler, plan.requirements(prefill, decode, scheduler)


def _widest(a: plan.Requirements | None, b: plan.Requirements) -> plan.Requirements:
    if a is None:
        return b
    return plan.Requirements(
        **{f.name: max(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(b)}
    )


def real_backend(
    preset: Preset,
    backend: str,
    name: str,
    out: Path,
    measured: Callable[[dict[str, Any]], None] = lambda _record: None,
) -> dict[str, Any]:
    """``--phase real`` for one backend, everything under ``out``: capacity probe, then per
    load the workload, the Vidur profile when the bundle does not cover it yet (one bundle per
    backend in ``out/profiles/<backend>``, widened to every load so far) and the real bench.
    Never imports Vidur. Returns the backend's manifest record, and hands the record so far to
    ``measured`` after the probe and after every load."""
    from gpu_simulate_test.profiling.vidur_profile import run as profile_run
    from gpu_simulate_test.real_bench.stage import run as real_bench_run
    from gpu_simulate_test.workloads.build import run as workload_run

    overrides = backend_overrides(preset, backend)
    profiling_root = out / "profiles" / backend
    cfg, resolved = compose_config(
        [*overrides, "progress=false", f"output.root={out}", f"profiling_root={profiling_root}"]
    )
    console.rule(f"[bold]{backend}: capacity probe ({preset.probe_requests[backend]} requests)")
    cap = measure_capacity(
        cfg, resolved, f"{name}-{backend}-capacity", preset.probe_requests[backend]
    )
    console.print(f"capacity {cap['capacity_qps']:.3g} req/s ({cap['output_tokens_per_s']} tok/s)")
    loads: list[dict[str, Any]] = []
    record = {
        "overrides": overrides,
        "profiling_root": str(profiling_root),
        "capacity": cap,
        "loads": loads,
    }
    measured(record)
    needs: plan.Requirements | None = None
    for index, (fraction, qps) in enumerate(fid.load_levels(cap["capacity_qps"])):
        console.rule(f"[bold]{backend}: {fraction:.0%} of capacity, {qps:.4g} req/s (real)")
        run_id = f"{name}-{backend}-load{index}"
        load_cfg, res = with_load(cfg, resolved, run_id, num_requests=preset.num_requests, qps=qps)
        workload_cfg, real_bench_cfg = stage_configs(load_cfg, run_id)
        workload_dir = workload_run(workload_cfg, res)
        scheduler, load_needs = scheduler_needs(load_cfg, workload_dir)
        needs = _widest(needs, load_needs)
        if preset.calibrate_each_load:  # this load's own bundle, made right before its run
            load_root = profiling_root / f"load{index}"
            load_cfg = dataclasses.replace(load_cfg, profiling_root=str(load_root))
            misfits = ["calibrate_each_load"]
        else:
            misfits = bundle_misfits(load_cfg, scheduler, needs)
        if misfits:
            console.print("profiling, because: " + "; ".join(misfits))
            profile_cfg = profile_config(
                load_cfg, scheduler, needs, workload_dir, workload_cfg.output, progress=False
            )
            profile_run(profile_cfg, dataclasses.asdict(profile_cfg))
        real_cfg = real_bench_cfg(str(workload_dir))
        real_dir = real_bench_run(real_cfg, dataclasses.asdict(real_cfg))
        repeats = [
            repeat_real(load_cfg, run_id, workload_dir, k)
            for k in range(2, preset.real_repeats + 1)
        ]
        load: dict[str, Any] = {
            "load_fraction": fraction,
            "offered_qps": qps,
            "run_id": run_id,
            "workload_dir": str(workload_dir),
            "real_dir": str(real_dir),
            "repeat_dirs": [str(d) for d in repeats],
            "scheduler": dataclasses.asdict(scheduler),
        }
        if preset.calibrate_each_load:
            load["profiling_root"] = load_cfg.profiling_root
        loads.append(load)
        measured(record)
    return record


def sim_backend(
    manifest: dict[str, Any],
    backend: str,
    name: str,
    src: Path,
    out: Path,
    extra: tuple[str, ...] = (),
) -> tuple[dict[str, Any], list[tuple[str, float, float, pd.DataFrame]], str, Noise]:
    """``--phase sim`` for one backend of a real phase's output ``src``: per load, Vidur
    simulates the recorded workload with the bundle profiled there and the same derived knobs,
    and compare pairs it with the recorded real bench (stage runs under ``tmp/``). ``extra``
    overrides (``--set``) change the simulation only, so two models meet one truth."""
    from gpu_simulate_test.analysis.stage import run as compare_run
    from gpu_simulate_test.vidur_ext.simulate import run as simulate_run

    rec = manifest["backends"][backend]
    profiling_root = src / rec["profiling_root"]
    cfg, _ = compose_config(
        [*rec["overrides"], *extra, "progress=false", f"profiling_root={profiling_root}"]
    )
    cap = {k: v for k, v in rec["capacity"].items() if k != "loads"}
    cap["probe_run"] = str(src / cap["probe_run"])
    compare_dirs = []
    noise: Noise = {}
    for load in fid.load_plan(manifest):
        if load.backend != backend:
            continue
        noise.update(repeat_noise(backend, load.load_fraction, [src / d for d in load.repeat_dirs]))
        console.rule(
            f"[bold]{backend}: {load.load_fraction:.0%} of capacity, "
            f"{load.offered_qps:.4g} req/s (simulated)"
        )
        workload_dir = src / load.workload_dir
        scheduler, needs = scheduler_needs(cfg, workload_dir)
        derived = as_stored_json(dataclasses.asdict(scheduler))
        if derived != dict(load.scheduler):
            raise SystemExit(
                f"{load.run_id}: derived scheduler {derived} differs from the one the real "
                f"phase recorded {dict(load.scheduler)}"
            )
        # the load's own bundle (calibrated right before its real run), or the backend's
        root = src / load.profiling_root if load.profiling_root else profiling_root
        load_cfg = dataclasses.replace(cfg, profiling_root=str(root))
        misfits = bundle_misfits(load_cfg, scheduler, needs)
        if misfits:
            raise SystemExit(f"{load.run_id}: the bundle does not fit: " + "; ".join(misfits))
        output = OutputConfig(root=cfg.output.root, run_id=load.run_id, overwrite=True)
        simulate_cfg = VidurSimulateStageConfig(
            model=cfg.model,
            hardware=cfg.hardware,
            vidur=simulation_vidur(cfg, scheduler),
            workload_dir=str(workload_dir),
            profiling_root=str(root),
            output=output,
            progress=False,
        )
        sim_dir = simulate_run(simulate_cfg, dataclasses.asdict(simulate_cfg))
        compare_cfg = CompareStageConfig(
            real_run_dir=str(src / load.real_dir),
            sim_run_dir=str(sim_dir),
            compare=cfg.compare,
            output=output,
            progress=False,
        )
        compare_dir = compare_run(compare_cfg, dataclasses.asdict(compare_cfg))
        compare_dirs.append((load.load_fraction, load.offered_qps, compare_dir))
    return finish_backend(backend, name, out, cap, compare_dirs, noise)


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict[str, Any]:
    """Device, driver, versions and date, for the report."""
    import torch

    if torch.cuda.is_available():
        device = torch.cuda.get_device_name(0)
        try:
            driver = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, check=True, timeout=30,
            ).stdout.strip().splitlines()[0]  # fmt: skip
        except (OSError, subprocess.SubprocessError, IndexError):
            driver = "unknown"
    else:
        cpu = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
        device, driver = f"CPU: {cpu} ({os.cpu_count()} cores)", "n/a (CPU)"
    return {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": device,
        "driver": driver,
        "torch_threads": torch.get_num_threads(),
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": str(torch.version.cuda),
            "transformers": _version("transformers"),
            "vidur": _version("vidur"),
        },
    }


def _command(argv: list[str] | None) -> str:
    return "python -m benchmarks.fidelity " + " ".join(sys.argv[1:] if argv is None else argv)


def _report(
    name: str,
    setup: dict[str, Any],
    capacity: dict[str, Any],
    levels: list[tuple[str, float, float, pd.DataFrame]],
    plot_files: dict[str, str],
    out: Path,
    noise: Noise | None = None,
) -> Path:
    table = fid.fidelity_rows(levels)
    if noise:
        table = fid.add_noise(table, noise)
    write_json(out / f"{name}-fidelity.json", fid.fidelity_json(name, setup, capacity, table))
    report = out / f"{name}-fidelity.md"
    with atomic_open(report) as handle:
        handle.write(fid.markdown(name, setup, capacity, table, plot_files))
    worst = fid.largest_abs_error(table)
    console.print(f"[bold]largest absolute error:[/] {worst}")
    console.print(f"[bold]report:[/] {report} ({setup['wall_time_s']} s)")
    return report


def phase_real(
    preset_name: str, preset: Preset, backends: tuple[str, ...], name: str, out: Path, command: str
) -> Path:
    """``--phase real``: the GPU half, under ``out``, and its manifest; returns the manifest.

    The manifest is written after the capacity probe and after every load, marked incomplete
    until the end: a real phase stopped part-way (Ctrl-C, a device call's time limit) leaves the
    loads it measured, which ``--phase sim`` reports as such."""
    started = time.perf_counter()
    env = environment()
    records: dict[str, dict[str, Any]] = {}

    def save(complete: bool) -> Path:
        manifest = fid.make_manifest(
            out,
            preset=preset_name,
            name=name,
            command=command,
            environment=env,
            requests_per_load=preset.num_requests,
            wall_time_s=round(time.perf_counter() - started, 1),
            backends=records,
            complete=complete,
        )
        return fid.write_manifest(out, manifest)

    def measured(backend: str, record: dict[str, Any]) -> None:
        records[backend] = record
        save(complete=False)

    try:
        for b in backends:
            real_backend(preset, b, name, out, functools.partial(measured, b))
    except KeyboardInterrupt:
        if records:
            console.print(
                f"[bold red]interrupted:[/] {out / fid.MANIFEST_FILE} keeps the loads measured "
                f"so far; --phase sim --from {out} reports them"
            )
        raise
    path = save(complete=True)
    console.print(f"[bold]manifest:[/] {path}; simulate with --phase sim --from {out}")
    return path


def phase_sim(
    src: Path, name: str | None, out: Path, command: str, extra: tuple[str, ...] = ()
) -> Path:
    """``--phase sim --from src``: simulate and compare every load the manifest lists; the
    report's device, driver and versions are the real phase's (vidur's is this machine's)."""
    manifest = fid.read_manifest(src)
    name = name or str(manifest["name"])
    started = time.perf_counter()
    capacity, levels, plot_files, noise = {}, [], {}, {}
    missing = fid.missing_loads(manifest)
    for backend in manifest["backends"]:
        if not manifest["backends"][backend]["loads"]:
            console.print(f"{backend}: the real phase stopped before its first load; left out")
            continue
        capacity[backend], rows, plot_files[backend], floor = sim_backend(
            manifest, backend, name, src, out, extra
        )
        levels += rows
        noise.update(floor)
    versions = dict(manifest.get("versions", {}))
    versions["vidur"] = _version("vidur")
    sim_wall = round(time.perf_counter() - started, 1)
    setup = {
        "preset": manifest["preset"],
        "command": f"{manifest.get('command', '?')} (real) ; {command}",
        "date": manifest.get("date"),
        "device": manifest.get("device"),
        "driver": manifest.get("driver"),
        "torch_threads": manifest.get("torch_threads"),
        "versions": versions,
        "requests_per_load": manifest["requests_per_load"],
        "wall_time_s": round(float(manifest.get("wall_time_s", 0.0)) + sim_wall, 1),
        "sim_wall_time_s": sim_wall,
        "real_from": str(src),
    }
    if not manifest.get("complete", True):
        setup["real_phase"] = "stopped part-way: " + ", ".join(
            f"{backend} without its last {n} load(s)" for backend, n in missing.items()
        )
    return _report(name, setup, capacity, levels, plot_files, out, noise)


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


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None)
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="both")
    parser.add_argument("--name", default=None, help="report name (default: the preset's)")
    parser.add_argument(
        "--out",
        default=None,
        help="where the report goes (default benchmarks/results); with --phase real, required: "
        "the root of every run and of the manifest",
    )
    parser.add_argument(
        "--phase",
        choices=("all", "real", "sim"),
        default="all",
        help="all: one call; real: the GPU half (no Vidur), writes the manifest; "
        "sim: simulate and report a real phase's output (--from)",
    )
    parser.add_argument("--from", dest="src", default=None, help="--phase sim: the real output")
    parser.add_argument(
        "--summarize",
        nargs="+",
        metavar="JSON",
        help="print one table over these <name>-fidelity.json reports (largest and median error, "
        "rows within 5%% and 10%%, per backend) and stop",
    )
    parser.add_argument(
        "--real-repeats",
        type=int,
        default=None,
        metavar="N",
        help="real bench runs per load on the same workload (default: the preset's); from 2 on "
        "the report shows real vs real, the noise floor",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        metavar="N",
        help="torch intra-op threads for every stage (default: the preset's; 0: torch's own)",
    )
    parser.add_argument(
        "--calibrate-each-load",
        action="store_true",
        help="profile and calibrate right before every load's real run, into its own bundle "
        "(default: once per backend)",
    )
    parser.add_argument(
        "--set",
        dest="extra",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an extra pipeline override for every run (repeatable), e.g. engine_overhead=false; "
        "with --phase sim it changes the simulation only (e.g. vidur.step_jitter=true)",
    )
    args = parser.parse_args(argv)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # started in the background, SIGINT inherited ignored: a sent one (scripts/
        # gpu_validate.sh's step time limit) must still stop the run cleanly, keeping what ran
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.summarize:
        reports = [read_json(Path(f), required_keys=("name", "rows")) for f in args.summarize]
        print(fid.summary_table(reports))
        return Path(args.summarize[0])
    command = _command(argv)
    if args.phase == "sim":
        if not args.src:
            parser.error("--phase sim needs --from <dir of a --phase real run>")
        if args.torch_threads is not None or args.calibrate_each_load:
            parser.error("--torch-threads and --calibrate-each-load shape the real runs: give "
                         "them to --phase real")  # fmt: skip
        out = Path(args.out or "benchmarks/results")
        out.mkdir(parents=True, exist_ok=True)
        return phase_sim(Path(args.src), args.name, out, command, tuple(args.extra))
    if args.preset is None:
        parser.error(f"--phase {args.phase} needs --preset")
    if args.src:
        parser.error("--from goes with --phase sim only")
    name = args.name or {"cpu_tiny": "cpu_qwen3_tiny", "gpu_0_6b": "gpu_qwen3_0_6b"}[args.preset]
    preset = dataclasses.replace(
        PRESETS[args.preset],
        overrides=(*PRESETS[args.preset].overrides, *args.extra),
        real_repeats=args.real_repeats or PRESETS[args.preset].real_repeats,
        torch_threads=PRESETS[args.preset].torch_threads
        if args.torch_threads is None
        else args.torch_threads,
        calibrate_each_load=args.calibrate_each_load or PRESETS[args.preset].calibrate_each_load,
    )
    if preset.real_repeats < 1:
        parser.error("--real-repeats must be >= 1")
    if preset.torch_threads < 0:
        parser.error("--torch-threads must be >= 0")
    backends = ("hf_cb", "hf_generate") if args.backend == "both" else (args.backend,)
    with torch_threads(preset.torch_threads):
        if args.phase == "real":
            if not args.out:
                parser.error("--phase real needs --out (the directory to bring back)")
            out = Path(args.out).resolve()
            out.mkdir(parents=True, exist_ok=True)
            return phase_real(args.preset, preset, backends, name, out, command)
        out = Path(args.out or "benchmarks/results")
        out.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        capacity, levels, plot_files, noise = {}, [], {}, {}
        for backend in backends:
            capacity[backend], rows, plot_files[backend], floor = run_backend(
                preset, backend, name, out
            )
            levels += rows
            noise.update(floor)
        setup = {
            "preset": args.preset,
            "command": command,
            **environment(),
            "requests_per_load": preset.num_requests,
            "real_runs_per_load": preset.real_repeats,
            "wall_time_s": round(time.perf_counter() - started, 1),
        }
        return _report(name, setup, capacity, levels, plot_files, out, noise)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:  # every stage has marked its run; the manifest says what is kept
        console.print("[bold red]interrupted[/] (Ctrl-C)")
        sys.exit(130)
