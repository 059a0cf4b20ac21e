"""Wall time of the vidur_simulate stage with a warm predictor cache, and its overhead over Vidur.

For each size (default 2,000 and 20,000 requests; tiny Qwen3 on a synthetic CPU bundle, sarathi):
the whole stage (``vidur_simulate.stage.run``: checks, trace, simulation, replay check, metrics)
against a bare ``vidur.simulator.Simulator(config).run()`` on the same config (built by the same
code, not timed). Target: the stage within 5 % of bare Vidur (on Vidur's loop; on our event
loop, the default since issue 19, the stage is many times faster: ``bench_event_loop``). Sizes
up to 2,000 report the best of ``--repeats`` alternating runs; larger ones run once per mode
(20,000 requests take minutes on 2 cores). Everything lives in a temporary directory.

Run: ``python -m benchmarks.speed.bench_vidur_simulate [--sizes 2000,20000] [--qps 40]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from gpu_simulate_test.config.schema import (
    LengthDistConfig,
    OutputConfig,
    WorkloadConfig,
)
from gpu_simulate_test.config.vidur import (
    VidurConfig,
    VidurPredictorConfig,
    VidurSimulateStageConfig,
)
from gpu_simulate_test.core.traffic.workloads import generate, write_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_json
from gpu_simulate_test.io.runs import start_run
from gpu_simulate_test.vidur_profile.synthetic import CPU, QWEN3_TINY, write_synthetic_bundle
from gpu_simulate_test.vidur_simulate import stage
from gpu_simulate_test.vidur_simulate.vidur_config import build_simulation_config

TARGET_OVERHEAD = 0.05
SMALL = 2000
WARMUP_REQUESTS = 200
"""Same length ranges, so the same bucketed prediction tables: it fills the cache cheaply."""


def make_workload(root: Path, n: int, qps: float) -> Path:
    cfg = replace(
        WorkloadConfig(),
        num_requests=n,
        qps=qps,
        prompt_len=LengthDistConfig(kind="uniform", min=32, max=1024),
        output_len=LengthDistConfig(kind="uniform", min=8, max=128),
    )
    workload, notes = generate(cfg, QWEN3_TINY)
    with start_run(root, "workload", f"w{n}", {"n": n}) as run:
        write_workload(run, workload, cfg, QWEN3_TINY, notes, show_progress=False)
    return run.path


def stage_config(root: Path, workload: Path, run_id: str) -> VidurSimulateStageConfig:
    return VidurSimulateStageConfig(
        model=QWEN3_TINY,
        hardware=CPU,
        workload_dir=str(workload),
        profiling_root=str(root / "profiles"),
        vidur=VidurConfig(predictor=VidurPredictorConfig(cache_dir=str(root / "cache"))),
        output=OutputConfig(root=str(root), run_id=run_id),
        progress=False,
    )


def time_stage(cfg: VidurSimulateStageConfig) -> tuple[float, str]:
    """Seconds for the whole stage, and whether the predictor came from the cache."""
    start = time.perf_counter()
    path = stage.run(cfg, {"bench": cfg.output.run_id})
    elapsed = time.perf_counter() - start
    return elapsed, str(read_json(path / layout.RUN_META)["predictor_cache"])


def time_bare(cfg: VidurSimulateStageConfig, root: Path) -> tuple[float, int]:
    """Bare Vidur on the stage's own config; returns seconds and rows written."""
    from vidur.simulator import Simulator
    from vidur.utils.random import set_seeds

    from gpu_simulate_test.vidur_simulate.registration import reset_entity_ids

    inputs = stage.prepare(cfg)
    out = root / f"bare-{cfg.output.run_id}"
    trace = stage.write_trace(out / stage.TRACE_FILE, inputs, inputs.scheduler_arrival_s())
    config = build_simulation_config(cfg, inputs, out, trace).simulation_config
    reset_entity_ids()
    set_seeds(config.seed)
    start = time.perf_counter()
    Simulator(config).run()
    elapsed = time.perf_counter() - start
    rows = sum(1 for _ in (out / stage.VIDUR_REQUEST_METRICS).open()) - 1
    return elapsed, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="2000,20000")
    parser.add_argument("--qps", type=float, default=40.0)
    parser.add_argument("--repeats", type=int, default=3, help=f"for sizes up to {SMALL:,}")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_synthetic_bundle(root / "profiles", QWEN3_TINY)
        workloads = {n: make_workload(root, n, args.qps) for n in [WARMUP_REQUESTS, *sizes]}
        warm, _ = time_stage(stage_config(root, workloads[WARMUP_REQUESTS], "warmup"))
        print(f"warm-up, {WARMUP_REQUESTS} requests (trains)     {warm:10.2f} s")
        for n in sizes:
            # small sizes: best of a few, alternating, to damp noise from a shared machine
            repeats = args.repeats if n <= SMALL else 1
            bare_times, stage_times = [], []
            for repeat in range(repeats):
                cfg = stage_config(root, workloads[n], f"s{n}-{repeat}")
                bare_s, rows = time_bare(cfg, root)
                stage_s, cache = time_stage(cfg)
                assert rows == n, f"bare Vidur wrote {rows} rows for {n} requests"
                assert cache == "hit", "the warm-up did not cover this size: the cache was cold"
                bare_times.append(bare_s)
                stage_times.append(stage_s)
            bare_s, stage_s = min(bare_times), min(stage_times)
            overhead = stage_s / bare_s - 1
            print(f"requests (best of {repeats})                {n:>10,}")
            print(f"  bare Vidur (warm cache)          {bare_s:10.2f} s")
            print(f"  vidur_simulate stage             {stage_s:10.2f} s")
            print(f"  simulated requests per second    {n / stage_s:10.0f}")
            print(
                f"  overhead over bare Vidur         {overhead:10.1%}  "
                f"(target {TARGET_OVERHEAD:.0%}; ratio to target {overhead / TARGET_OVERHEAD:.2f})"
            )


if __name__ == "__main__":
    main()
