"""Does our vLLM V1 scheduler take the steps vLLM takes? Oracle replays of real vLLM runs.

Every real run is replayed by ``vidur_simulate step_times_from=<run>`` (vLLM's V1 scheduler in
our event loop, timed by the run's own recorded steps and queued at the engine's own arrival
stamps), then ``compare``d with it as a user runs both stages. Per run it prints the share of
steps with the same composition (step k against step k), the preemptions on both sides, the
first divergence, and the engine-clock errors of TTFT, TPOT and E2E at p50 and p90 (the
fidelity warm-up left out). Issue 27's targets: >= 98% of steps the same, every error within 2%,
preemptions within 10%.

Runs: the fidelity stage's real phase (its defaults: tiny Qwen3 on CPU against vLLM, loads at
20/50/85% of the measured capacity, each load twice; ``--campaign`` reads one made before), and
one preempting load: the 50% workload against a server with ``--preempt-blocks`` KV blocks
(``--preempt-run`` reads one made before).

With prefix caching (a campaign run with ``backend.enable_prefix_caching=true``, e.g. on
``workload=shared_prefix``; ``--prefix-caching`` for the preempting run) it also prints, per run,
the share of requests served the same cached tokens and the hit rate of each side (issue 45's
targets: >= 99% of requests, hit rate within 1 point).

Run: ``python -m benchmarks.fidelity.bench_oracle [--campaign tmp/fidelity/X] [--preempt-run DIR]
[--preempt-blocks 10] [--prefix-caching] [--profiles tmp/profiles] [--out F.json]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.truth.bench_truth import real_dirs, run_campaign
from gpu_simulate_test.fidelity.manifest import load_plan, read_manifest

METRICS = ("ttft", "tpot", "e2e")
STATS = ("p50", "p90")


def cli(stage: str, *overrides: str) -> None:
    cmd = [sys.executable, "-m", f"gpu_simulate_test.cli.{stage}", *overrides]
    print("$ " + " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)


def replay(run: Path, profiles: Path, out_root: Path, warmup_s: float) -> dict[str, Any]:
    """Oracle-replay one real run and compare; the figures of its comparison."""
    meta = json.loads((run / "run_meta.json").read_text())
    name = f"{run.parent.parent.parent.name}-{run.name}"
    cli(
        "vidur_simulate",
        f"workload_dir={meta['workload_dir']}",
        f"step_times_from={run}",
        f"profiling_root={profiles}",
        f"output.root={out_root}",
        f"output.run_id={name}",
        "progress=false",  # the scheduler's knobs are the run's (its run_meta.json)
    )
    sim = out_root / "vidur_simulate" / name
    cli(
        "compare",
        f"real_run_dir={run}",
        f"sim_run_dir={sim}",
        f"compare.warmup_s={warmup_s}",
        f"output.root={out_root}",
        f"output.run_id={name}",
        "progress=false",
    )
    data = json.loads((out_root / "compare" / name / "comparison.json").read_text())
    steps = data["steps"]
    errors = {
        f"{row['metric']}_{row['stat']}": row["error_vs_engine"]
        for row in data["clocks"]
        if row["metric"] in METRICS and row["stat"] in STATS
    }
    sim_meta = json.loads((sim / "run_meta.json").read_text())
    figures = {
        "run": str(run),
        "requests": meta["num_requests"],
        "same_composition_fraction": steps["same_composition_fraction"],
        "real_steps": steps["alignment"]["real_steps"],
        "sim_steps": steps["alignment"]["sim_steps"],
        "preemptions": steps["alignment"]["preemptions"],
        "first_divergence": steps["alignment"]["first_divergence"],
        "step_times": (sim_meta.get("oracle") or {}).get("step_times"),
        "engine_errors": errors,
        "simulation_s": sim_meta["timings_s"]["simulation"],
        "prefix_cache": cache_figures(run, sim, meta, sim_meta),
    }
    return figures


def cache_figures(
    run: Path, sim: Path, meta: dict[str, Any], sim_meta: dict[str, Any]
) -> dict[str, Any] | None:
    """With prefix caching: cached tokens per request identical (share), and the hit rate of
    each side (vLLM's counters, the simulation's totals)."""
    simulated = sim_meta.get("prefix_cache")
    if not simulated:
        return None
    import pandas as pd

    real = pd.read_csv(run / "request_metrics.csv").set_index("request_id")
    mine = pd.read_csv(sim / "request_metrics.csv").set_index("request_id")
    both = real.join(mine[["cached_tokens"]], rsuffix="_sim", how="inner")
    column = (
        "engine_cached_tokens" if both["engine_cached_tokens"].notna().all() else "cached_tokens"
    )
    same = float((both[column] == both["cached_tokens_sim"]).mean())
    return {
        "requests_same_cached_tokens": same,
        "real_hit_rate": (meta.get("engine_log") or {}).get("prefix_cache_hit_rate"),
        "sim_hit_rate": simulated.get("hit_rate"),
        "real_column": column,
    }


def preempting_run(campaign: Path, blocks: int, out: Path, caching: bool = False) -> Path:
    """The 50% load's workload against a server with ``blocks`` KV blocks (and the prefix cache
    on with ``caching``)."""
    workload = next(
        campaign / "runs" / "workload" / r.real_dir.split("/")[-1]
        for r in load_plan(read_manifest(campaign))
        if abs(r.load_fraction - 0.5) < 1e-9
    )
    run_id = f"preempt-{blocks}"
    cli(
        "real_bench",
        f"workload_dir={workload}",
        "backend=vllm",
        "backend.max_num_batched_tokens=256",
        f"backend.num_gpu_blocks_override={blocks}",
        *(["backend.enable_prefix_caching=true"] if caching else []),
        f"output.root={out}",
        f"output.run_id={run_id}",
        "progress=false",
    )
    return out / "real_bench" / run_id


def row(label: str, figures: dict[str, Any]) -> str:
    errors = figures["engine_errors"]
    worst = max(abs(v) for v in errors.values())
    pre = figures["preemptions"]
    return (
        f"| {label} | {figures['requests']} | {figures['real_steps']} / {figures['sim_steps']} "
        f"| {figures['same_composition_fraction']:.2%} | {pre['real']} / {pre['sim']} | "
        + " | ".join(f"{errors[f'{m}_{s}']:+.2%}" for m in METRICS for s in STATS)
        + f" | {worst:.2%} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--campaign", type=Path, help="a fidelity campaign run before")
    parser.add_argument("--preempt-run", type=Path, help="a preempting real_bench run")
    parser.add_argument("--preempt-blocks", type=int, default=10)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--profiles", type=Path, help="the bundle root (default: the campaign's)")
    parser.add_argument(
        "--prefix-caching", action="store_true", help="the preempting run with the cache on"
    )
    args, overrides = parser.parse_known_args()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    campaign = args.campaign or run_campaign("default", f"oracle-{stamp}", overrides)
    manifest = read_manifest(campaign)
    warmup_s = float(manifest.get("warmup_s", 0.0))
    profiles = args.profiles or campaign / "profiles"  # a campaign with reuse_profile: tmp/profiles
    out_root = campaign / f"oracle-{stamp}"
    results: list[dict[str, Any]] = []
    for record in load_plan(manifest):
        for run in real_dirs(campaign, record):
            figures = replay(run, profiles, out_root, warmup_s)
            figures["label"] = f"{record.load_fraction:.0%} load, {run.name}"
            results.append(figures)
    preempt = args.preempt_run or preempting_run(
        campaign, args.preempt_blocks, out_root, args.prefix_caching
    )
    figures = replay(preempt, profiles, out_root, warmup_s)
    figures["label"] = f"preempting ({preempt.name})"
    results.append(figures)

    header = (
        "| run | requests | steps real / sim | same composition | preemptions real / sim | "
        + " | ".join(f"{m.upper()} {s}" for m in METRICS for s in STATS)
        + " | largest |"
    )
    print("\n" + header + "\n|" + " --- |" * (header.count("|") - 1))
    for figures in results:
        print(row(figures["label"], figures))
    for figures in results:
        cache = figures["prefix_cache"]
        if cache:
            print(
                f"- {figures['label']}: cached tokens identical on "
                f"{cache['requests_same_cached_tokens']:.2%} of requests; hit rate real "
                f"{cache['real_hit_rate']:.4f}, simulated {cache['sim_hit_rate']:.4f}"
            )
    for figures in results:
        if figures["first_divergence"]:
            print(f"- {figures['label']}: first divergence {figures['first_divergence']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "command": " ".join(
                        ["python -m benchmarks.fidelity.bench_oracle", *sys.argv[1:]]
                    ),
                    "date": stamp,
                    "campaign": str(campaign),
                    "device": manifest.get("device"),
                    "versions": manifest.get("versions"),
                    "results": results,
                },
                indent=1,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
