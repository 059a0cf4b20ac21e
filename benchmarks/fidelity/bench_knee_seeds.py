"""The knee's rows against two spreads: the simulation's own (its seeds) and the truth's stalls.

Near capacity one slow moment fills the batch to its cap and the queue behind it, so a p90 can
hang on one episode. For each stored fidelity campaign (``tmp/fidelity/<RUN>``, a real phase or
a whole run) and load fraction, this simulates the load at its real run's own step level
(:func:`~gpu_simulate_test.orchestrate.step_level.real_step_level`, as the fidelity report's
diagnosis does) once per seed and variant, and prints per engine-clock row (TTFT and TPOT p50 /
p90): the truth, its repeat, the simulation's mean over the seeds and its range (the
simulation's own spread; a difference between variants inside it is no difference). Beside it,
the truth's stalls: steps more than ``--stall-ms`` beyond the median of their composition's
steps in the same run (decodes, prompt tokens in 32s), the requests whose life they or the queue
behind them (until a step finds none waiting) fell in, and the row again without those
requests (what the rest of the run says).

Run: ``python -m benchmarks.fidelity.bench_knee_seeds RUN [RUN ...] [--load 0.85] [--seeds 4]
[--variant NAME=OVERRIDE[,OVERRIDE] ...] [--out F.json]``; the variant ``as_is`` (no
overrides) is always run first.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROWS = (("ttft", "p50"), ("ttft", "p90"), ("tpot", "p50"), ("tpot", "p90"))
ENGINE = {"ttft": "engine_ttft_s", "tpot": "engine_tpot_s"}


def stalls(schedule: pd.DataFrame, stall_ms: float) -> pd.DataFrame:
    """The steps more than ``stall_ms`` beyond the median of their composition's steps (in the
    same run; compositions of fewer than 5 steps are not judged)."""
    dur = (schedule["end_time_s"] - schedule["start_time_s"]) * 1e3
    key = [
        schedule["num_decode_requests"].clip(upper=30),
        (schedule["num_prefill_tokens"] // 32).clip(upper=8),
    ]
    grouped = dur.groupby(key)
    excess = dur - grouped.transform("median")
    judged = grouped.transform("count") >= 5
    out = schedule.assign(dur_ms=dur, excess_ms=excess)
    return out[judged & (excess > stall_ms)]


def truth(real_dir: Path, warmup_s: float, stall_ms: float) -> dict[str, Any]:
    """A real run's engine rows, its stalls, and the rows without the requests they hit."""
    requests = pd.read_csv(real_dir / "request_metrics.csv")
    requests = requests[(requests["status"] == "ok") & (requests["arrival_time_s"] >= warmup_s)]
    schedule = pd.read_csv(real_dir / "engine_schedule.csv")
    slow = stalls(schedule, stall_ms)
    hit = np.zeros(len(requests), dtype=bool)
    first = requests["engine_scheduled_time_s"].to_numpy(dtype=float)
    last = requests["engine_last_token_time_s"].to_numpy(dtype=float)
    calm = schedule.loc[schedule["num_waiting"] == 0, "start_time_s"].to_numpy(dtype=float)
    for start, end in zip(slow["start_time_s"], slow["end_time_s"], strict=True):
        after = calm[calm >= end]  # the stall's queue: until a step finds none waiting
        until = float(after[0]) if len(after) else float(schedule["end_time_s"].iloc[-1])
        hit |= (first < until) & (last > start)
    rows, without = {}, {}
    for metric, stat in ROWS:
        values = requests[ENGINE[metric]].to_numpy(dtype=float) * 1e3
        q = float(stat[1:]) / 100
        rows[f"{metric} {stat}"] = float(np.nanquantile(values, q))
        without[f"{metric} {stat}"] = float(np.nanquantile(values[~hit], q))
    return {
        "rows": rows,
        "without_stalled": without,
        "stalls": len(slow),
        "stall_ms": [round(float(v), 1) for v in slow["dur_ms"]],
        "stall_at_s": [round(float(v), 2) for v in slow["start_time_s"]],
        "requests": len(requests),
        "requests_hit": int(hit.sum()),
    }


def simulated(src: Path, fraction: float, overrides: list[str], seed: int) -> dict[str, float]:
    """One seed of the load simulated at its real run's step level: its engine rows (ms)."""
    from benchmarks.fidelity.bench_sim_variants import pipeline_config
    from gpu_simulate_test.config.schema import OutputConfig
    from gpu_simulate_test.fidelity import contract
    from gpu_simulate_test.fidelity.manifest import load_plan, read_manifest
    from gpu_simulate_test.fidelity.sim_phase import level_percentiles, sim_config
    from gpu_simulate_test.orchestrate.profiling import recorded_plan
    from gpu_simulate_test.orchestrate.step_level import real_step_level
    from gpu_simulate_test.orchestrate.steps import simulate_and_compare

    manifest = read_manifest(src)
    rec = manifest["backends"]["vllm"]
    base = pipeline_config(overrides)
    cfg = sim_config(base, rec["config"], src / contract.MANIFEST_FILE)
    load = next(p for p in load_plan(manifest) if abs(p.load_fraction - fraction) < 1e-6)
    out = Path("tmp") / "bench_knee_seeds"
    load_cfg = dataclasses.replace(
        cfg,
        compare=dataclasses.replace(cfg.compare, warmup_s=load.warmup_s),
        output=OutputConfig(root=str(out), run_id=f"{src.name}-{load.run_id}", overwrite=True),
        profiling_root=str(src / (load.profiling_root or rec["profiling_root"])),
        reuse_profile=True,
        progress=False,
    )
    workload, real = src / load.workload_dir, src / load.real_dir
    decided = recorded_plan(
        load_cfg, workload, load.scheduler, src / contract.MANIFEST_FILE, load.run_id
    )
    level = real_step_level(load_cfg, decided.scheduler, workload, real, out / "step_models")
    ratio = float(level["ratio"]) if level else 1.0
    vidur = dataclasses.replace(load_cfg.vidur, step_time_scale=ratio, seed=seed)
    at = dataclasses.replace(load_cfg, vidur=vidur)
    _, compare_dir = simulate_and_compare(at, decided.scheduler, workload, real)
    got = level_percentiles(compare_dir)
    return {f"{m} {s}": got[("engine", m, s)] for m, s in ROWS} | {"level": ratio}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", help="fidelity run ids or paths (tmp/fidelity/RUN)")
    parser.add_argument("--load", type=float, default=0.85)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--stall-ms", type=float, default=10.0)
    parser.add_argument("--variant", action="append", default=[], help="NAME=OVERRIDE[,...]")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    variants = {"as_is": []} | {
        v.split("=", 1)[0]: v.split("=", 1)[1].split(",") for v in args.variant
    }
    seeds = [42, *range(1, args.seeds)]
    from gpu_simulate_test.fidelity.manifest import load_plan, read_manifest

    record: dict[str, Any] = {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.fidelity.bench_knee_seeds", *sys.argv[1:]]),
        "seeds": seeds,
        "campaigns": {},
    }
    for run in args.runs:
        src = Path(run) if Path(run).is_dir() else Path("tmp") / "fidelity" / run
        plan = read_manifest(src)
        load = next(p for p in load_plan(plan) if abs(p.load_fraction - args.load) < 1e-6)
        real = truth(src / load.real_dir, load.warmup_s, args.stall_ms)
        again = [truth(src / d, load.warmup_s, args.stall_ms) for d in load.repeat_dirs]
        sims = {
            name: [simulated(src, args.load, over, seed) for seed in seeds]
            for name, over in variants.items()
        }
        record["campaigns"][src.name] = {"truth": real, "repeats": again, "simulated": sims}
        print(f"\n{src.name}, {args.load:.0%} of capacity, engine clock (ms)")
        print(
            f"  truth: {real['stalls']} stall(s) {real['stall_ms']} at {real['stall_at_s']} s, "
            f"{real['requests_hit']} of {real['requests']} requests alive in them"
            + "".join(f"; repeat: {a['stalls']} stall(s) at {a['stall_at_s']} s" for a in again)
        )
        head = "| row | truth | without stalled | repeat |"
        head += "".join(f" {n}: mean (range) | vs truth |" for n in sims)
        print(head)
        for m, s in ROWS:
            key = f"{m} {s}"
            line = f"| {key} | {real['rows'][key]:.2f} | {real['without_stalled'][key]:.2f} | "
            line += ", ".join(f"{a['rows'][key]:.2f}" for a in again) + " |"
            for runs in sims.values():
                vals = np.array([r[key] for r in runs])
                line += f" {vals.mean():.2f} ({vals.min():.2f}-{vals.max():.2f}) |"
                line += f" {vals.mean() / real['rows'][key] - 1:+.1%} |"
            print(line)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
