"""Simulated requests per second: our event loop (the whole stage) against bare Vidur 0.0.26.

Issue 19's targets, on tiny Qwen3 with a synthetic CPU bundle (sarathi, cap 32, chunk 512;
prompts 32-1,024 tokens, outputs 8-128, Poisson arrivals at ``--qps``), warm predictor cache:

1. at ``--sizes`` requests (default 100,000): the whole ``vidur_simulate`` stage on our loop
   (``vidur.event_loop=fast``: checks, trace, simulation, replay check, metrics) against a bare
   ``vidur.simulator.Simulator(config).run()`` on the same config, built by the same code; the
   ratio of simulated requests per second is the figure (target >= 10x). With ``--check`` the
   stage is also run on Vidur's loop and the two ``request_metrics.csv`` compared byte for byte;
2. ``--million`` simulates 1,000,000 requests through the stage (``vidur.step_log=false``: tens
   of millions of batches make no useful CSV) in a child process and prints its wall time
   (target <= 300 s) and peak memory (the child's maximum resident set).

Bare Vidur at 100,000 requests takes about half an hour on two shared cores: ``--bare-sizes``
picks the sizes it runs at (default: every size).

Run: ``python -m benchmarks.speed.bench_event_loop [--sizes 100000] [--million] [--check]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.speed.bench_vidur_simulate import CPU, make_workload, time_bare
from gpu_simulate_test.config.schema import OutputConfig
from gpu_simulate_test.config.vidur import (
    VidurConfig,
    VidurPredictorConfig,
    VidurSchedulerConfig,
    VidurSimulateStageConfig,
)
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_json
from gpu_simulate_test.vidur_profile.synthetic import QWEN3_TINY, write_synthetic_bundle
from gpu_simulate_test.vidur_simulate import stage

TARGET_RATIO = 10.0
TARGET_MILLION_S = 300.0
WARMUP_REQUESTS = 200
SCHEDULER = VidurSchedulerConfig(name="sarathi", batch_size_cap=32, chunk_size=512)


def config(
    root: Path,
    workload: Path,
    run_id: str,
    loop: str = "fast",
    step_log: bool = True,
    scheduler: VidurSchedulerConfig = SCHEDULER,
) -> VidurSimulateStageConfig:
    return VidurSimulateStageConfig(
        model=QWEN3_TINY,
        hardware=CPU,
        workload_dir=str(workload),
        profiling_root=str(root / "profiles"),
        vidur=VidurConfig(
            scheduler=scheduler,
            predictor=VidurPredictorConfig(cache_dir=str(root / "cache")),
            event_loop=loop,
            step_log=step_log,
        ),
        output=OutputConfig(root=str(root), run_id=run_id),
        progress=False,
    )


def time_stage(cfg: VidurSimulateStageConfig) -> tuple[float, Path, dict[str, object]]:
    start = time.perf_counter()
    path = stage.run(cfg, {"bench": cfg.output.run_id})
    return time.perf_counter() - start, path, read_json(path / layout.RUN_META)


def million(root: Path, qps: float) -> None:
    """The child process of ``--million``: build the workload, then time the stage."""
    workload = make_workload(root, 1_000_000, qps)
    # tens of millions of batches: no per-batch log (vidur.step_log=false)
    elapsed, path, meta = time_stage(config(root, workload, "million", step_log=False))
    assert meta["event_loop"] == "fast", meta.get("event_loop_note")
    rows = sum(1 for _ in (path / layout.REQUEST_METRICS).open()) - 1
    print(f"  requests simulated               {rows:>12,}")
    print(
        f"  stage wall time                  {elapsed:12.1f} s  (target {TARGET_MILLION_S:.0f} s)"
    )
    print(f"  of which simulation              {meta['timings_s']['simulation']:12.1f} s")  # type: ignore[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="100000")
    parser.add_argument("--bare-sizes", default=None, help="sizes to run bare Vidur at")
    parser.add_argument("--qps", type=float, default=40.0)
    parser.add_argument("--check", action="store_true", help="also run the stage on Vidur's loop")
    parser.add_argument("--million", action="store_true")
    parser.add_argument("--million-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--scheduler",
        default="sarathi",
        help="sarathi (Vidur's, the reference), or vllm_v1 (vLLM's, our loop only: no bare "
        "Vidur, no --check)",
    )
    args = parser.parse_args()
    if args.million_child:
        million(Path(args.million_child), args.qps)
        return
    sizes = [int(s) for s in args.sizes.split(",") if s]
    bare_sizes = (
        sizes if args.bare_sizes is None else [int(s) for s in args.bare_sizes.split(",") if s]
    )
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_synthetic_bundle(root / "profiles", QWEN3_TINY)
        warm, _, _ = time_stage(
            config(root, make_workload(root, WARMUP_REQUESTS, args.qps), "warm")
        )
        print(f"warm-up, {WARMUP_REQUESTS} requests (trains the predictor) {warm:8.2f} s")
        chosen = dataclasses.replace(SCHEDULER, name=args.scheduler)
        for n in sizes:
            workload = make_workload(root, n, args.qps)
            fast_s, fast_dir, meta = time_stage(
                config(root, workload, f"fast{n}", scheduler=chosen)
            )
            assert meta["event_loop"] == "fast", meta.get("event_loop_note")
            assert meta["predictor_cache"] == "hit", "the warm-up did not cover this size"
            print(f"requests                           {n:>12,}")
            print(f"  stage, our loop                  {fast_s:12.2f} s  ({n / fast_s:,.0f} req/s)")
            print(f"    of which simulation            {meta['timings_s']['simulation']:12.2f} s")  # type: ignore[index]
            if args.check and args.scheduler == "sarathi":
                ref_s, ref_path, _ = time_stage(config(root, workload, f"vidur{n}", "vidur"))
                same = all(
                    (fast_dir / name).read_bytes() == (ref_path / name).read_bytes()
                    for name in (layout.REQUEST_METRICS, layout.ENGINE_STEP_LOG)
                )
                print(f"  stage, Vidur's loop              {ref_s:12.2f} s  (same bytes: {same})")
            if n in bare_sizes and args.scheduler == "sarathi":
                bare_s, rows = time_bare(config(root, workload, f"bare{n}", "vidur"), root)
                assert rows == n, f"bare Vidur wrote {rows} rows for {n} requests"
                ratio = bare_s / fast_s
                rate = n / bare_s
                print(f"  bare Vidur                       {bare_s:12.2f} s  ({rate:,.0f} req/s)")
                print(
                    f"  speed-up (stage vs bare Vidur)   {ratio:12.1f}x "
                    f"(target {TARGET_RATIO:.0f}x; "
                    f"ratio to target {ratio / TARGET_RATIO:.2f})"
                )
        if args.million:
            print("requests                              1,000,000 (child process)")
            start = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "benchmarks.speed.bench_event_loop", "--qps", str(args.qps),
                 "--million-child", str(root)],
                check=True,
            )  # fmt: skip
            peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
            print(f"  child wall time (with workload)  {time.perf_counter() - start:12.1f} s")
            print(f"  peak memory (child max RSS)      {peak:12.0f} MiB")


if __name__ == "__main__":
    main()
