"""Can the truth be trusted? The fidelity campaign's real runs, judged as issue 26's targets ask.

For each shape, the fidelity stage's real phase (its defaults: tiny Qwen3 on CPU against vLLM,
the capacity probe, 20/50/85% of capacity, each load at least ``fidelity.load_duration_s`` of
arrivals with a warm-up left out, every load run twice) is run ``--repeats`` times, or read from
runs made before (``--runs``). Per shape and load it prints, over every real run:

- the **arrival error** p99 and max (ms): the target is p99 ≤ 2 ms at every load;
- the share of **held-back** token gaps and the real bench's disturbance verdicts (with re-runs);
- **real vs real** on the engine's own clock (what Vidur models) and on the client's: for each of
  TTFT, TPOT and E2E at p50 and p90, the second run against the first; the targets are median
  ≤ 5% and largest ≤ 15% on the engine clock;
- the steady-state check of the measured window (completion / arrival, the queue's trend).

Shapes: ``default`` (the stage's own: Poisson, prompts 16-64, outputs 4-16) and ``bursty`` (gamma
arrivals, burstiness 0.25, the same lengths).

Run: ``python -m benchmarks.truth.bench_truth [--shapes default,bursty] [--repeats 1] [--out F.json]
[overrides...]`` or ``python -m benchmarks.truth.bench_truth --runs tmp/fidelity/A tmp/fidelity/B``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from gpu_simulate_test.core.metrics import percentiles as pct
from gpu_simulate_test.core.metrics import window
from gpu_simulate_test.core.run_inputs import load_run
from gpu_simulate_test.fidelity import tables as fid
from gpu_simulate_test.fidelity.manifest import PlannedLoad, load_plan, read_manifest

SHAPES: dict[str, tuple[str, ...]] = {
    "default": (),
    "bursty": ("workload.arrival.process=gamma", "workload.arrival.burstiness=0.25"),
}


def run_campaign(shape: str, run_id: str, overrides: list[str]) -> Path:
    """The fidelity stage's real phase for ``shape``, as a user runs it."""
    cmd = [
        sys.executable, "-m", "gpu_simulate_test.cli.fidelity", "fidelity.phase=real",
        f"output.run_id={run_id}", *SHAPES[shape], *overrides,
    ]  # fmt: skip
    print("$ " + " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True)
    return Path("tmp") / "fidelity" / run_id


def real_dirs(root: Path, record: PlannedLoad) -> list[Path]:
    """Every real run of one load, in order (the one that counts after any re-run)."""
    return [root / d for d in (record.real_dir, *record.repeat_dirs)]


def run_figures(real_dir: Path, warmup_s: float) -> dict[str, Any]:
    meta = json.loads((real_dir / "run_meta.json").read_text())
    signs = (meta.get("disturbance") or {}).get("signs") or {}
    requests = load_run(real_dir, "real_bench").requests
    error_ms = pct.describe(requests["arrival_error_s"].to_numpy(dtype=float), scale=1e3)
    held = (signs.get("held_back_streams") or {}).get("figure")
    return {
        "run": real_dir.name,
        "requests": len(requests),
        "arrival_error_p99_ms": round(error_ms.stat("p99"), 3),
        "arrival_error_max_ms": round(error_ms.max, 3),
        "held_back_share": held,
        "disturbed": bool((meta.get("disturbance") or {}).get("disturbed")),
        "cpu_cores_by_process": meta.get("cpu_cores_by_process"),
        "window": window.steady_state(requests, warmup_s),
        "percentiles": {
            "/".join(key): value
            for key, value in fid.real_percentiles(requests, warmup_s=warmup_s).items()
        },
    }


def real_vs_real(runs: list[dict[str, Any]], clock: str) -> list[float]:
    """|second / first − 1| of each goal percentile on ``clock`` (empty without two runs)."""
    if len(runs) < 2:
        return []
    first, again = runs[0]["percentiles"], runs[1]["percentiles"]
    out = []
    for key, value in first.items():
        if key.startswith(f"{clock}/") and key in again and np.isfinite(value) and value > 0:
            out.append(abs(again[key] / value - 1))
    return out


def campaign_figures(root: Path) -> dict[str, Any]:
    manifest = read_manifest(root)
    warmup_s = float(manifest.get("warmup_s", 0.0))
    loads = []
    for record in load_plan(manifest):
        runs = [run_figures(d, warmup_s) for d in real_dirs(root, record)]
        attempts = sum(len(t.get("attempts", ())) for t in record.truth)
        loads.append(
            {
                "load_fraction": record.load_fraction,
                "offered_qps": record.offered_qps,
                "runs": runs,
                "attempts": attempts,
                "engine_real_vs_real": real_vs_real(runs, "engine"),
                "client_real_vs_real": real_vs_real(runs, "client"),
            }
        )
    backend = next(iter(manifest["backends"].values()))
    return {
        "run": str(root),
        "capacity_qps": backend["capacity"]["capacity_qps"],
        "warmup_s": warmup_s,
        "load_duration_s": manifest.get("load_duration_s"),
        "loads": loads,
    }


def share(values: list[float], how: str) -> str:
    if not values:
        return "–"
    return f"{100 * (np.median(values) if how == 'median' else max(values)):.1f}%"


def print_table(shape: str, campaign: dict[str, Any]) -> None:
    print(
        f"\n## {shape}: {campaign['run']} (capacity {campaign['capacity_qps']:.4g} req/s, "
        f"warm-up {campaign['warmup_s']:g} s)\n"
    )
    print(
        "| load | req/s | requests | arrival error p99 / max (ms) | held back | disturbed "
        "(attempts) | engine: real vs real median / largest | client: median / largest "
        "| completion / arrival | queue trend |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for load in campaign["loads"]:
        runs = load["runs"]
        late = ", ".join(
            f"{r['arrival_error_p99_ms']:.2f} / {r['arrival_error_max_ms']:.1f}" for r in runs
        )
        held = ", ".join(
            "–" if r["held_back_share"] is None else f"{r['held_back_share']:.1%}" for r in runs
        )
        disturbed = sum(r["disturbed"] for r in runs)
        e, c = load["engine_real_vs_real"], load["client_real_vs_real"]
        ratio = ", ".join(str(r["window"]["completion_ratio"]) for r in runs)
        trend = ", ".join(str(r["window"]["queue_trend"]) for r in runs)
        print(
            f"| {load['load_fraction']:.0%} | {load['offered_qps']:.4g} | {runs[0]['requests']} "
            f"| {late} | {held} | {disturbed} of {len(runs)} ({load['attempts']}) | "
            f"{share(e, 'median')} / {share(e, 'max')} | "
            f"{share(c, 'median')} / {share(c, 'max')} | "
            f"{ratio} | {trend} |"
        )
    every_e = [v for load in campaign["loads"] for v in load["engine_real_vs_real"]]
    every_c = [v for load in campaign["loads"] for v in load["client_real_vs_real"]]
    worst_p99 = max(r["arrival_error_p99_ms"] for load in campaign["loads"] for r in load["runs"])
    print(
        f"\nover every load: arrival error p99 at most {worst_p99:.2f} ms (target 2); engine "
        f"clock real vs real median {share(every_e, 'median')}, largest {share(every_e, 'max')} "
        f"(targets 5%, 15%); client clock median {share(every_c, 'median')}, largest "
        f"{share(every_c, 'max')}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--runs", nargs="*", type=Path, default=None, help="read these instead")
    parser.add_argument("--prefix", default="truth")
    parser.add_argument("--out", type=Path, default=None)
    args, overrides = parser.parse_known_args()
    results: dict[str, list[dict[str, Any]]] = {}
    if args.runs:
        for root in args.runs:
            command = read_manifest(root).get("command", "")
            shape = "bursty" if "gamma" in command else "default"
            results.setdefault(shape, []).append(campaign_figures(root))
    else:
        for k in range(args.repeats):
            for shape in args.shapes.split(","):
                root = run_campaign(shape, f"{args.prefix}-{shape}-{k}", overrides)
                results.setdefault(shape, []).append(campaign_figures(root))
    for shape, campaigns in results.items():
        for campaign in campaigns:
            print_table(shape, campaign)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
