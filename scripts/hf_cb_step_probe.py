"""Where an ``hf_cb`` step's time goes: alone on an idle engine (as the engine calibration
times it) against under a Poisson load (as the real bench replays it), on one loaded model.

The engine calibration of 2026-11-25 on an H100 timed a decode step of one request at 43 ms;
the real bench's inter-token times at the same contexts were about twice that, so every
simulated latency came out 45-60% short (benchmarks/results/h100_qwen3_0_6b_20261125). This
probe runs both conditions in one process on one engine and records every engine step from
inside the generation thread (the model call, and the loop's own work between calls), phase by
phase:

- ``idle1``: one request (32-token prompt, 64 tokens) alone, the calibration's decode row;
- ``idle1_nvml``: the same with the real bench's NVML sampler running (every 0.1 s);
- ``idle4``: four such requests together;
- ``load``: a Poisson replay through the real bench's harness (prompts uniform 32-512,
  outputs 16-128, ``--rate`` req/s, ``--requests`` requests), with the NVML sampler;
- ``load_quiet``: the same requests, without it;
- ``idle1_after``: ``idle1`` again, after the load;
- ``*_prof``: ``idle1`` and a short ``load`` again under cProfile of the generation thread.

Writes ``steps.csv`` (one row per step), ``phases.json`` (per phase: step and gap medians by
batch size, inter-token medians) and ``profile_<phase>.txt``, and prints a table.

    python scripts/hf_cb_step_probe.py --out tmp/step_probe model=qwen3_tiny hardware=cpu
    python scripts/hf_cb_step_probe.py --out $OUT model=qwen3_0_6b hardware=h100 \
        backend.max_num_batched_tokens=512 backend.max_num_seqs=32 \
        backend.num_gpu_blocks_override=4096
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hydra import compose, initialize_config_dir

from gpu_simulate_test.calibration.common import random_prompt
from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.core.engines import get_backend
from gpu_simulate_test.core.engines.harness import gc_paused, replay, switch_interval
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder
from gpu_simulate_test.real_bench.telemetry import TelemetrySampler


class StepTap:
    """Times every ``_generation_step`` of the manager from inside its thread, with the
    batch's composition, and runs cProfile there while ``profile_as`` names a phase."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.rows: list[dict[str, Any]] = []
        self.phase = "warmup"
        self.profile_as: str | None = None
        self.profiles: dict[str, cProfile.Profile] = {}
        self._active: tuple[str, cProfile.Profile] | None = None
        original = manager._generation_step

        def step() -> None:
            self._profiling()
            try:
                batch = manager.batch_processor.inputs_and_outputs.requests_in_batch
                queries = [fs.query_length for fs in batch]
            except AttributeError:
                queries = []
            start = time.perf_counter()
            original()
            end = time.perf_counter()
            self.rows.append(
                {
                    "phase": self.phase,
                    "start": start,
                    "end": end,
                    "num_requests": len(queries),
                    "num_prefill": sum(q > 1 for q in queries),
                    "query_tokens": sum(queries),
                }
            )

        manager._generation_step = step

    def _profiling(self) -> None:
        """Start or stop this thread's profiler to match ``profile_as``."""
        want = self.profile_as
        if self._active is not None and self._active[0] != want:
            self._active[1].disable()
            self._active = None
        if want is not None and self._active is None:
            prof = self.profiles.setdefault(want, cProfile.Profile())
            prof.enable()
            self._active = (want, prof)


def build_config(overrides: list[str]) -> RealBenchStageConfig:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            config_name="real_bench",
            overrides=["backend=hf_cb", "workload_dir=step_probe", "progress=false", *overrides],
        )
    return to_typed(cfg, RealBenchStageConfig)


class Ids:
    def __init__(self) -> None:
        self.next = 1000

    def take(self) -> int:
        self.next += 1
        return self.next


def together(
    ids: Ids, count: int, prompt: int, out: int, vocab: int, seed: int
) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)
    return [
        BenchRequest(ids.take(), prompt, out, 0.0, random_prompt(rng, vocab, prompt))
        for _ in range(count)
    ]


def poisson(ids: Ids, count: int, rate: float, vocab: int, seed: int) -> list[BenchRequest]:
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, count)
    arrivals = np.cumsum(gaps) - gaps[0]
    prompts = rng.integers(32, 513, count)
    outs = rng.integers(16, 129, count)
    return [
        BenchRequest(ids.take(), int(p), int(o), float(a), random_prompt(rng, vocab, int(p)))
        for a, p, o in zip(arrivals, prompts, outs, strict=True)
    ]


def run_phase(
    name: str,
    backend: Any,
    recorder: Recorder,
    tap: StepTap,
    requests: list[BenchRequest],
    device: str,
    nvml: bool,
    profile: bool = False,
) -> dict[str, Any]:
    recorder.add(requests)
    telemetry = TelemetrySampler(device, 0.1) if nvml else None
    if telemetry is not None:
        telemetry.start()
    tap.phase = name
    tap.profile_as = name if profile else None
    started = time.perf_counter()
    replay(backend, requests, recorder, 600.0)
    ids = [r.request_id for r in requests]
    while not all(recorder.records[i].is_done for i in ids):
        time.sleep(0.01)
    ended = time.perf_counter()
    tap.profile_as = None
    if telemetry is not None:
        telemetry.stop()
    time.sleep(0.3)  # let the engine go idle (and the profiler stop) before the next phase
    itl: list[float] = []
    for i in ids:
        times = recorder.records[i].engine_token_times_s
        itl.extend(np.diff(times) * 1e3)
    return {
        "phase": name,
        "wall_s": round(ended - started, 3),
        "requests": len(requests),
        "nvml": telemetry is not None and telemetry.available,
        "nvml_samples": 0 if telemetry is None else len(telemetry.samples),
        "engine_itl_ms_p50": round(float(np.median(itl)), 3) if itl else None,
        "engine_itl_ms_mean": round(float(np.mean(itl)), 3) if itl else None,
        "profiled": profile,
    }


def summarize(steps: pd.DataFrame, phases: list[dict[str, Any]]) -> None:
    steps = steps.sort_values("start").reset_index(drop=True)
    steps["step_ms"] = 1e3 * (steps["end"] - steps["start"])
    # the loop's own work between one step's end and the next one's start, within a phase
    steps["gap_ms"] = 1e3 * (steps["start"] - steps["end"].shift(1))
    steps.loc[steps["phase"] != steps["phase"].shift(1), "gap_ms"] = np.nan
    for ph in phases:
        s = steps[steps["phase"] == ph["phase"]]
        busy = s[s["gap_ms"] < 50]  # a gap over 50 ms: the engine sat idle waiting for work
        dec = s[s["num_prefill"] == 0]
        by_batch = {}
        for b, g in dec.groupby("num_requests"):
            gb = g[g["gap_ms"] < 50]
            by_batch[int(b)] = {
                "steps": len(g),
                "step_ms_p50": round(float(g["step_ms"].median()), 3),
                "gap_ms_p50": round(float(gb["gap_ms"].median()), 3) if len(gb) else None,
            }
        ph.update(
            steps=len(s),
            decode_step_ms_p50=round(float(dec["step_ms"].median()), 3) if len(dec) else None,
            gap_ms_p50=round(float(busy["gap_ms"].median()), 3) if len(busy) else None,
            gap_ms_mean=round(float(busy["gap_ms"].mean()), 3) if len(busy) else None,
            decode_by_batch=by_batch,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rate", type=float, default=1.5, help="the load's requests per second")
    parser.add_argument("--requests", type=int, default=32, help="the load's requests")
    parser.add_argument("--phases", default="", help="comma-separated phases to run (all)")
    parser.add_argument(
        "--torch-threads", type=int, default=0, help="torch CPU threads (0: default)"
    )
    parser.add_argument("--no-second", action="store_true", help="skip the second engine")
    parser.add_argument("overrides", nargs="*", help="real_bench overrides (model=, ...)")
    args = parser.parse_args()
    if args.torch_threads > 0:
        import torch

        torch.set_num_threads(args.torch_threads)
    args.out.mkdir(parents=True, exist_ok=True)
    cfg = build_config(args.overrides)
    vocab, device = cfg.model.vocab_size, cfg.hardware.device
    ids = Ids()
    backend: Any = get_backend("hf_cb")(cfg)
    recorder = Recorder([])
    t0 = time.perf_counter()
    backend.start(recorder)
    tap = StepTap(backend.manager)
    backend.warmup(together(ids, 2, 32, 8, vocab, 1))
    print(f"model loaded and warm in {time.perf_counter() - t0:.1f} s", flush=True)
    load = poisson(ids, args.requests, args.rate, vocab, 7)
    short = load[: max(4, args.requests // 3)]
    plan: list[tuple[str, list[BenchRequest], bool, bool]] = [
        ("idle1", together(ids, 1, 32, 64, vocab, 2), False, False),
        ("idle1_nvml", together(ids, 1, 32, 64, vocab, 3), True, False),
        ("idle4", together(ids, 4, 32, 64, vocab, 4), False, False),
        ("load", load, True, False),
        ("load_quiet", poisson(ids, args.requests, args.rate, vocab, 7), False, False),
        ("idle1_after", together(ids, 1, 32, 64, vocab, 5), False, False),
        ("idle1_prof", together(ids, 1, 32, 64, vocab, 6), False, True),
        ("load_prof", [dataclass_copy(r, ids.take()) for r in short], True, True),
    ]
    wanted = set(filter(None, args.phases.split(",")))
    plan = [p for p in plan if not wanted or p[0] in wanted]
    phases: list[dict[str, Any]] = []
    try:
        with switch_interval(cfg.backend.gil_switch_interval_s), gc_paused():
            for name, reqs, nvml, prof in plan:
                ph = run_phase(name, backend, recorder, tap, reqs, device, nvml, prof)
                phases.append(ph)
                print(json.dumps(ph), flush=True)
    finally:
        backend.close()
    if args.no_second:
        finish(args.out, tap.rows, phases, tap.profiles)
        return
    # a second engine in the same process, as the fidelity stage starts one per stage
    print("threads after the first engine closed:", [t.name for t in threading.enumerate()])
    second: Any = get_backend("hf_cb")(cfg)
    second.start(recorder)
    tap2 = StepTap(second.manager)
    second.warmup(together(ids, 2, 32, 8, vocab, 1))
    try:
        with switch_interval(cfg.backend.gil_switch_interval_s), gc_paused():
            for name, reqs, nvml in (
                ("2nd_idle1", together(ids, 1, 32, 64, vocab, 2), False),
                ("2nd_load", [dataclass_copy(r, ids.take()) for r in load], True),
            ):
                ph = run_phase(name, second, recorder, tap2, reqs, device, nvml)
                phases.append(ph)
                print(json.dumps(ph), flush=True)
    finally:
        second.close()
    finish(args.out, tap.rows + tap2.rows, phases, tap.profiles)


def finish(
    out: Path,
    rows: list[dict[str, Any]],
    phases: list[dict[str, Any]],
    profiles: dict[str, cProfile.Profile],
) -> None:
    """Write the steps, the phases and the profiles; print the table."""
    import torch

    steps = pd.DataFrame(rows)
    summarize(steps, phases)
    steps.to_csv(out / "steps.csv", index=False)
    (out / "phases.json").write_text(json.dumps(phases, indent=1))
    for name, prof in profiles.items():
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(45)
        text.write("\n---- by own time ----\n")
        pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(30)
        (out / f"profile_{name}.txt").write_text(text.getvalue())
    head = f"{'phase':<12} {'itl p50':>8} {'step p50':>9} {'gap p50':>8}"
    print(head, " decode by batch (step/gap)")
    for ph in phases:
        batches = " ".join(
            f"{b}:{v['step_ms_p50']}/{v['gap_ms_p50']}"
            for b, v in sorted(ph["decode_by_batch"].items())[:6]
        )
        print(
            f"{ph['phase']:<12} {ph['engine_itl_ms_p50']!s:>8} {ph['decode_step_ms_p50']!s:>9} "
            f"{ph['gap_ms_p50']!s:>8}  {batches}"
        )
    print("torch threads", torch.get_num_threads())
    print("threads at the end:", [t.name for t in threading.enumerate()])


def dataclass_copy(req: BenchRequest, new_id: int) -> BenchRequest:
    import dataclasses

    return dataclasses.replace(req, request_id=new_id)


if __name__ == "__main__":
    main()
