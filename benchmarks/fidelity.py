"""Fidelity harness: capacity, three loads real + simulated, one table (docs/fidelity.md).

Run: ``python -m benchmarks.fidelity --preset cpu_tiny|gpu_0_6b [--backend hf_cb|hf_generate|both]
[--name NAME] [--out benchmarks/results]``. Per backend: an all-at-once burst replayed for real
gives the capacity (max sustainable requests/s for the preset's fixed length mix); then the
pipeline (workload → profile, reused when it fits → Vidur → real bench → compare) runs at 20%,
50% and 85% of it with the same seeded workload. Writes ``<name>-fidelity.md``,
``<name>-fidelity.json`` and ``<name>-<backend>-latency-vs-load.png`` into ``--out``; the
stages' run directories stay in ``tmp/<stage>/<name>-<backend>-*``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

from gpu_simulate_test.analysis import fidelity as fid
from gpu_simulate_test.analysis import plots
from gpu_simulate_test.analysis.inputs import load_run
from gpu_simulate_test.analysis.schemas import COMPARISON_PERCENTILES
from gpu_simulate_test.analysis.sweep import SWEEP_STATS, X_LABELS, sweep_table
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.registry import CONFIG_DIR, register_configs, to_typed
from gpu_simulate_test.config.schema import ArrivalConfig
from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.pipeline.run import run as pipeline_run
from gpu_simulate_test.pipeline.run import stage_configs
from gpu_simulate_test.reporting import console

BACKENDS: tuple[str, ...] = ("hf_cb", "hf_generate")


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
        },
        probe_requests={"hf_cb": 24, "hf_generate": 8},
        num_requests=16,
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
    res = json.loads(json.dumps(resolved, default=str))
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


def run_backend(
    preset: Preset, backend: str, name: str, out: Path
) -> tuple[dict[str, Any], list[tuple[str, float, float, pd.DataFrame]], str]:
    """Capacity, then the three loads real + simulated; returns the capacity record, the
    per-load percentiles and the plot's file name."""
    overrides = [*preset.overrides, f"backend={backend}", *preset.backend_overrides[backend]]
    cfg, resolved = compose_config([*overrides, "progress=false"])
    console.rule(f"[bold]{backend}: capacity probe ({preset.probe_requests[backend]} requests)")
    cap = measure_capacity(
        cfg, resolved, f"{name}-{backend}-capacity", preset.probe_requests[backend]
    )
    console.print(f"capacity {cap['capacity_qps']:.3g} req/s ({cap['output_tokens_per_s']} tok/s)")
    levels, runs, loads = [], [], []
    for index, (fraction, qps) in enumerate(fid.load_levels(cap["capacity_qps"])):
        console.rule(f"[bold]{backend}: {fraction:.0%} of capacity, {qps:.4g} req/s")
        load_cfg, res = with_load(
            cfg,
            resolved,
            f"{name}-{backend}-load{index}",
            num_requests=preset.num_requests,
            qps=qps,
        )
        compare_dir = pipeline_run(load_cfg, res)
        percentiles = read_csv(compare_dir / "percentiles.csv", COMPARISON_PERCENTILES)
        comparison = read_json(compare_dir / "comparison.json", required_keys=("offered_qps",))
        real_dir = Path(read_json(compare_dir / "run_meta.json")["config"]["real_run_dir"])
        req = load_run(real_dir, "real_bench").requests
        ratio = fid.completion_ratio(
            req["arrival_time_s"], req["e2e_s"], (req["status"] == "ok").to_numpy()
        )
        loads.append(
            {
                "load_fraction": fraction,
                "offered_qps": qps,
                "realized_qps": round(float(comparison["offered_qps"]), 4),
                "completion_ratio": round(ratio, 3),
                "sustained": fid.is_sustained(ratio),
                "compare_run": str(compare_dir),
            }
        )
        levels.append((backend, fraction, qps, percentiles))
        runs.append((compare_dir, comparison, percentiles))
    cap["loads"] = loads
    plot = f"{name}-{backend}-latency-vs-load.png"
    plots.plot_sweep(
        sweep_table(runs, "offered_qps"), out / plot, X_LABELS["offered_qps"], SWEEP_STATS
    )
    return cap, levels, plot


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
        "versions": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cuda": str(torch.version.cuda),
            "transformers": _version("transformers"),
            "vidur": _version("vidur"),
        },
    }


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True)
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="both")
    parser.add_argument("--name", default=None, help="report name (default: the preset's)")
    parser.add_argument("--out", default="benchmarks/results", help="where the report goes")
    args = parser.parse_args(argv)
    preset = PRESETS[args.preset]
    name = args.name or {"cpu_tiny": "cpu_qwen3_tiny", "gpu_0_6b": "gpu_qwen3_0_6b"}[args.preset]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    started = time.perf_counter()
    capacity, levels, plot_files = {}, [], {}
    for backend in backends:
        capacity[backend], rows, plot_files[backend] = run_backend(preset, backend, name, out)
        levels += rows
    table = fid.fidelity_rows(levels)
    setup = {
        "preset": args.preset,
        "command": "python -m benchmarks.fidelity "
        + " ".join(sys.argv[1:] if argv is None else argv),
        **environment(),
        "requests_per_load": preset.num_requests,
        "wall_time_s": round(time.perf_counter() - started, 1),
    }
    (out / f"{name}-fidelity.json").write_text(
        json.dumps(fid.fidelity_json(name, setup, capacity, table), indent=2) + "\n"
    )
    report = out / f"{name}-fidelity.md"
    report.write_text(fid.markdown(name, setup, capacity, table, plot_files))
    worst = fid.largest_abs_error(table)
    console.print(f"[bold]largest absolute error:[/] {worst}")
    console.print(f"[bold]report:[/] {report} ({setup['wall_time_s']} s)")
    return report


if __name__ == "__main__":
    main()
