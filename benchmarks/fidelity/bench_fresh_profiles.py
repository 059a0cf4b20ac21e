"""The main job on fresh profiles: does every fresh calibration give the same prediction?

Runs the pipeline (``make run``'s job: tiny Qwen3 on CPU against a vLLM server, 40 requests at
4 req/s) ``--runs`` times, each with a fresh profile and engine calibration
(``reuse_profile=false``) under its own profiling root (``tmp/profiles/fresh/<run>``, kept
for ``bench_sim_variants``), one at a time, and prints per run the calibrated front end (its
source, the line, the iteration log's reading beside it and whether they agree) and the
simulation's p50 errors of TTFT, TPOT and E2E against the real run, on the client's clock and
on the engine's, and the calibration's own check (the profile stage's and the validation
replay's wall time, the replay's largest p50 error and verdict). Issue 28's targets: every p50
within ±10% on every fresh profile; calibration plus validation within 2 minutes. Beside the
simulation's count it prints the truth's: how many real runs landed within the same ±10% of their
own repeat (``pipeline.real_repeat``), which bounds what the simulation's count can show.
Then issue 64's client TTFT targets and its front end's, the front end read both as the
two-clocks table's difference of percentiles and per request (``front_end_requests``, from the
runs' stored tables: per run, and over the batch's requests pooled, each seed apart and at the
real run's step level).

Run: ``python -m benchmarks.fidelity.bench_fresh_profiles [--runs 5] [--out F.json]
[overrides...]``, or ``--from F.json [G.json ...]`` to print runs stored before, pooled.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from gpu_simulate_test.compare import front_end
from gpu_simulate_test.compare.metrics import relative_error
from gpu_simulate_test.compare.ttft_parts import repeat_front_end
from gpu_simulate_test.fidelity.bounds import LIMIT, METRICS, passes


def one(run_id: str, overrides: list[str]) -> dict[str, Any]:
    # each run calibrates into its own profiling root, so that bench_sim_variants can later
    # re-simulate every run on its own bundle (a paired A/B), not on the last run's
    own_root = (
        []
        if any(o.startswith("profiling_root=") for o in overrides)
        else [f"profiling_root=tmp/profiles/fresh/{run_id}"]
    )
    cmd = [
        sys.executable, "-m", "gpu_simulate_test.cli.pipeline", "reuse_profile=false",
        f"output.run_id={run_id}", "progress=false", *own_root, *overrides,
    ]  # fmt: skip
    print("$ " + " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    meta = json.loads((Path("tmp") / "pipeline" / run_id / "run_meta.json").read_text())
    stages = meta["stages"]
    bundle = json.loads((Path(stages["vidur_profile"]["path"]) / "meta.json").read_text())
    calibration = (bundle.get("engine_calibration") or {}).get("vllm") or {}
    frontend = calibration.get("frontend")
    data = json.loads((Path(stages["compare"]["path"]) / "comparison.json").read_text())
    client = {
        f"{row['metric']}_p50": row["error_vs_client"]
        for row in data["clocks"]
        if row["stat"] == "p50" and row["metric"] in METRICS
    }
    engine = {
        f"{row['metric']}_p50": row["error_vs_engine"]
        for row in data["clocks"]
        if row["stat"] == "p50" and row["metric"] in METRICS
    }
    noise = {  # the truth run twice (pipeline.real_repeat): its run-to-run difference
        f"{row['metric']}_p50": {
            "engine": row.get("noise_vs_engine"),
            "client": row.get("noise_vs_client"),
        }
        for row in data["clocks"]
        if row["stat"] == "p50" and row["metric"] in METRICS
    }
    checks = meta.get("calibration_check") or []
    ttft = {  # TTFT at p50/p90/p99 on both clocks, with the truth's own repeat beside
        f"{clock}_{row['stat']}": {
            "error": row.get(f"error_vs_{clock}"),
            "real_vs_real": row.get(f"noise_vs_{clock}"),
            "seeds": [  # the other seeds' errors (pipeline.sim_seeds), where simulated
                relative_error(v, row[f"{clock}_s"])
                for v in row.get("seeds_sim_s" if clock == "client" else "seeds_sim_engine_s", [])
            ],
            "pooled": row.get(f"pooled_vs_{clock}"),  # every seed's requests together
            # at the real run's own step level (pipeline.at_level): a diagnosis, not the answer
            "at_level": row.get(f"at_level_vs_{clock}"),
        }
        for row in data["clocks"]
        if row["metric"] == "ttft"
        for clock in ("client", "engine")
    }
    parts = data.get("ttft_parts") or {}
    return {
        "ttft": ttft,
        "front_end": parts.get("front_end"),
        "front_end_requests": data.get("front_end_requests"),
        "verdict": {
            k: (data.get("verdict") or {}).get(k) for k in ("within", "judged", "truth", "at_level")
        },
        "step_level": (data.get("at_real_step_level") or {}).get("ratio"),
        "run": run_id,
        "profile_s": stages["vidur_profile"]["wall_time_s"],
        "validation_s": sum(c.get("wall_time_s", 0.0) for c in checks),
        "validation": [
            {"p50_error": c["p50_error"], "passed": c["passed"], "largest": c["largest_abs_error"]}
            for c in checks
        ],
        "frontend": frontend,
        "calibration_attempts": calibration.get("attempts"),
        "calibration_drift": (calibration.get("serving") or {}).get("drift"),
        "calibration_s": calibration.get("wall_time_s"),
        "client_p50": client,
        "engine_p50": engine,
        "real_vs_real_p50": noise,
        "same_composition_fraction": data.get("steps", {}).get("same_composition_fraction"),
        "step_time_error": (data.get("steps", {}).get("totals") or {}).get("step_time_error"),
        "host_memory": data.get("host_memory"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--from", dest="stored", nargs="*", type=Path, default=None,
                        help="print the results stored in these --out files instead")  # fmt: skip
    args, overrides = parser.parse_known_args()
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    if args.stored:
        results = [r for f in args.stored for r in json.loads(f.read_text())["results"]]
    else:
        results = [one(f"fresh-{stamp}-{i}", overrides) for i in range(args.runs)]
    print(
        "\n| run | front end: input + per running · n, output (ms) | log's idle total (agree) "
        "| TTFT p50 | TPOT p50 | E2E p50 | engine TTFT p50 | engine TPOT p50 | engine E2E p50 "
        "| profile + validation (s) | validation: largest p50 error (passed) |"
    )
    print("|" + " --- |" * 11)
    for r in results:
        f = r["frontend"] or {}
        check = f.get("check") or {}
        front = (
            f"{f.get('input_ms')} + {f.get('input_per_running_ms')}·n, {f.get('output_ms')}"
            f" ({f.get('source', 'engine log')})"
        )
        log = f"{check.get('engine_log_idle_total_ms')} ({check.get('agree')})" if check else "–"
        errors = [r["client_p50"].get(f"{m}_p50") for m in METRICS] + [
            r["engine_p50"].get(f"{m}_p50") for m in METRICS
        ]
        cells = " | ".join(f"{e:+.1%}" if e is not None else "–" for e in errors)
        took = (  # runs stored before a figure existed print "–" for it
            f"{r.get('profile_s', float('nan')):.0f} + {r.get('validation_s', float('nan')):.0f}"
            f" (calibrated {r.get('calibration_attempts')}×, drift {r.get('calibration_drift')})"
        )
        checks = r.get("validation") or []
        judged = ", ".join(f"{v['largest']:.1%} ({v['passed']})" for v in checks) or "–"
        print(f"| {r['run']} | {front} | {log} | {cells} | {took} | {judged} |")
    sim_met, truth_met, repeated = passes(results)
    print(
        f"\nevery p50 within ±{LIMIT:.0%} on both clocks: the simulation {sim_met} of "
        f"{len(results)}; the truth against its own repeat {truth_met} of {repeated}"
    )
    print("real vs real (the truth run twice), p50 engine / client:")
    for r in results:
        noise = r.get("real_vs_real_p50") or {}
        print(
            f"  {r['run']}: "
            + ", ".join(
                f"{m.upper()} {fmt(noise.get(f'{m}_p50', {}).get('engine'))} / "
                f"{fmt(noise.get(f'{m}_p50', {}).get('client'))}"
                for m in METRICS
            )
        )
    print(
        "\nsimulated steps vs the engine's (same compositions), and the host's memory at the truth"
    )
    print("over the calibration's (one LM head read on the engine's core; real / repeat):")
    for r in results:
        memory = r.get("host_memory") or {}
        ratios = [
            f"{(memory.get(k) or {}).get('ratio', float('nan')):.2f}x"
            for k in ("real", "real_again")
        ]
        print(
            f"  {r['run']}: step time {fmt(r.get('step_time_error'))}, "
            f"host memory {' / '.join(ratios)}"
        )
    ttft_targets(results)
    front_end_targets(results)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "command": " ".join(
                        ["python -m benchmarks.fidelity.bench_fresh_profiles", *sys.argv[1:]]
                    ),
                    "date": stamp,
                    "results": results,
                },
                indent=1,
            )
        )


def ttft_targets(results: list[dict[str, Any]]) -> None:
    """Issue 64's targets for the main job: client TTFT p50 and p90 each within max(10%, real vs
    real) in 4 of 5 runs, their mean signed error within ±5%, and the simulated front end
    (client − engine TTFT) within 20% of the real one at p50 / p90 / p99, counted strictly and
    within max(20%, the truth's own repeat of it), as every other target is judged."""
    with_ttft = [r for r in results if r.get("ttft")]
    if not with_ttft:
        return
    print("\nclient TTFT, sim against real (real vs real), and the front end real / sim (ms):")
    print("| run | " + " | ".join(f"client TTFT {q}" for q in QUANTILES)
          + " | front end p50 | p90 | p99 |")  # fmt: skip
    print("|" + " --- |" * 7)
    for r in with_ttft:
        cells = [error_cell(r["ttft"].get(f"client_{q}")) for q in QUANTILES]
        print(f"| {r['run']} | " + " | ".join(cells + front_cells(r.get("front_end"))) + " |")
    for q in ("p50", "p90"):
        figures = [r["ttft"].get(f"client_{q}") for r in with_ttft]
        within, count, mean = judged(figures)
        print(
            f"client TTFT {q}: within max({LIMIT:.0%}, real vs real) in {within} of "
            f"{count}; mean signed {fmt(mean)} (target: 4 of 5, within ±5%)"
        )
        print(f"  beside (pipeline.sim_seeds, pipeline.at_level): {seed_lines(figures)}")
    for q in QUANTILES:
        fronts = [front_end_of(r).get(q) for r in with_ttft]
        rows: list[dict[str, Any]] = [
            {
                "error": relative_error(f["sim_ms"], f["real_ms"]),
                "real_vs_real": (
                    relative_error(f["repeat_ms"], f["real_ms"]) if "repeat_ms" in f else None
                ),
            }
            for f in fronts
            if f and f["real_ms"]
        ]
        print(front_line(f"front end {q}", rows))


SIM_SIDES: tuple[tuple[str, str], ...] = (
    ("sim", "vidur_simulate"),
    ("seed +1", "vidur_simulate_seed1"),
    ("seed +2", "vidur_simulate_seed2"),
    ("at the real run's step level", "vidur_simulate_at_level"),
)
"""The simulations a pipeline run keeps (its name here, its stage's key in ``run_meta``)."""


def front_end_sides(run: str, root: Path = Path("tmp")) -> dict[str, pd.Series] | None:
    """A stored pipeline run's per-request front end (:mod:`~gpu_simulate_test.compare.front_end`)
    on every side it kept: ``real``, ``repeat`` and each of :data:`SIM_SIDES`; None where the run
    is no longer under ``root``."""
    meta = root / "pipeline" / run / "run_meta.json"
    if not meta.is_file():
        return None
    stages = json.loads(meta.read_text())["stages"]

    def table(key: str) -> pd.DataFrame | None:
        where = (stages.get(key) or {}).get("path")
        path = None if where is None else Path(where) / "request_metrics.csv"
        return pd.read_csv(path) if path is not None and path.is_file() else None

    out: dict[str, pd.Series] = {}
    for side, key in (("real", "real_bench"), ("repeat", "real_bench_repeat")):
        if (frame := table(key)) is not None:
            out[side] = front_end.real_front_end_s(frame)
    for side, key in SIM_SIDES:
        if (frame := table(key)) is not None:
            out[side] = front_end.sim_front_end_s(frame)
    return out if "real" in out and "sim" in out else None


def front_end_targets(results: list[dict[str, Any]]) -> None:
    """Issue 64's front-end target read on each request's own front end (client − engine TTFT
    per request, then its percentiles; the table above takes the two percentiles' difference,
    two different requests at p90 and p99): per run within 20% of the real one, and within
    max(20%, the truth's repeat of it); then over every run's requests pooled, each seed apart,
    where a tail quantile rests on more than one request. Read from the runs' stored tables
    (``tmp/pipeline/<run>``)."""
    runs = [(r["run"], front_end_sides(r["run"])) for r in results]
    kept = [(run, sides) for run, sides in runs if sides is not None]
    if not kept:
        return
    print(f"\neach request's own front end (client − engine TTFT), {len(kept)} stored runs:")
    for q in front_end.STATS[:3]:
        rows = []
        for _, sides in kept:
            one = front_end.pooled([sides]) or {}
            if "sim_vs_real" in one:
                again = (one.get("repeat_vs_real") or {}).get(q)
                rows.append({"error": one["sim_vs_real"][q], "real_vs_real": again})
        print(front_line(f"  {q}", rows))
    for side, _ in SIM_SIDES:
        mine = [{**s, "sim": s[side]} for _, s in kept if side in s]
        record = front_end.pooled(mine)
        if record is None:
            continue
        repeat = (
            f", the truth's repeat {triple(record, 'repeat_ms')} "
            f"({triple(record, 'repeat_vs_real')})"
            if "repeat_ms" in record
            else ""
        )
        print(
            f"  pooled ({side}, {len(mine)} runs, {record['requests']} requests) p50 / p90 / p99: "
            f"real {triple(record, 'real_ms')} ms, simulated {triple(record, 'sim_ms')} "
            f"({triple(record, 'sim_vs_real')}){repeat}"
        )


def front_line(label: str, rows: Sequence[dict[str, Any]]) -> str:
    """One front-end figure over the runs (``rows``: each ``error`` and ``real_vs_real``): each
    run's, how many are within :data:`FRONT_LIMIT` and within max(it, real vs real), and the
    mean signed error."""
    strict = sum(abs(row["error"]) <= FRONT_LIMIT for row in rows)
    within, count, mean = judged(rows, FRONT_LIMIT)
    return (
        f"{label}: simulated − real (real vs real) "
        + ", ".join(f"{fmt(row['error'])} ({fmt(row['real_vs_real'])})" for row in rows)
        + f"; within {FRONT_LIMIT:.0%} in {strict} of {count}, within max({FRONT_LIMIT:.0%}, "
        f"real vs real) in {within}; mean signed {fmt(mean)}"
    )


def triple(record: dict[str, Any], key: str) -> str:
    """``record[key]`` at p50 / p90 / p99: ms (a ``_ms`` key) or signed errors."""
    return " / ".join(
        f"{record[key][q]:.1f}" if key.endswith("_ms") else fmt(record[key][q]) for q in QUANTILES
    )


def seed_lines(rows: Sequence[dict[str, Any] | None]) -> str:
    """Each other seed's count within max(10%, real vs real) and mean signed error over the
    runs that simulated it, every seed's requests pooled, and the simulation at the real run's
    own step level (``pipeline.at_level``; a diagnosis that reads the judged run)."""
    k_max = max((len((r or {}).get("seeds") or []) for r in rows), default=0)
    out = []
    for k in range(k_max):
        mine = [
            {"error": r["seeds"][k], "real_vs_real": r.get("real_vs_real")}
            for r in rows
            if r and len(r.get("seeds") or []) > k
        ]
        within, count, mean = judged(mine)
        out.append(f"seed +{k + 1} {within} of {count}, {fmt(mean)}")
    for key, label, after in (
        ("pooled", "every seed's requests pooled", ""),
        ("at_level", "at the real run's step level", " (a diagnosis)"),
    ):
        mine = [
            {"error": r[key], "real_vs_real": r.get("real_vs_real")}
            for r in rows
            if r and r.get(key) is not None
        ]
        if mine:
            within, count, mean = judged(mine)
            out.append(f"{label} {within} of {count}, {fmt(mean)}{after}")
    return "; ".join(out) or "none simulated"


FRONT_LIMIT = 0.20
"""Issue 64's bound on the simulated front end against the real one."""


def front_end_of(result: dict[str, Any]) -> dict[str, Any]:
    """A run's front end (compare's ``ttft_parts.front_end``) with the truth's repeat
    (``repeat_ms``); a run stored before the repeat was kept reads it from its comparison under
    ``tmp/compare`` where that is still there."""
    front: dict[str, Any] = result.get("front_end") or {}
    if front and not any("repeat_ms" in v for v in front.values()):
        stored = Path("tmp") / "compare" / result["run"] / "comparison.json"
        if stored.is_file():
            rows = json.loads(stored.read_text()).get("clocks") or []
            repeats = {r["stat"]: repeat_front_end(r) for r in rows if r["metric"] == "ttft"}
            front = {q: {**v, **repeats.get(q, {})} for q, v in front.items()}
    return front


QUANTILES = ("p50", "p90", "p99")


def error_cell(row: dict[str, Any] | None) -> str:
    """``error (real vs real)`` of one figure (``error``, ``real_vs_real``)."""
    row = row or {}
    return f"{fmt(row.get('error'))} ({fmt(row.get('real_vs_real'))})"


def front_cells(front: dict[str, Any] | None) -> list[str]:
    """The front end's ``real / sim`` (ms) at p50, p90 and p99 of compare's ``ttft_parts``."""
    front = front or {}
    return [
        f"{(front.get(q) or {}).get('real_ms', float('nan')):.1f} / "
        f"{(front.get(q) or {}).get('sim_ms', float('nan')):.1f}"
        for q in QUANTILES
    ]


def judged(rows: Sequence[dict[str, Any] | None], limit: float = LIMIT) -> tuple[int, int, float]:
    """Of figures with an ``error``: how many are within max(limit, |real vs real|), how many
    there are, and their mean signed error."""
    errors = [r for r in rows if r and r.get("error") is not None]
    within = sum(abs(r["error"]) <= max(limit, abs(r.get("real_vs_real") or 0.0)) for r in errors)
    mean = sum(r["error"] for r in errors) / len(errors) if errors else float("nan")
    return within, len(errors), mean


def fmt(value: float | None) -> str:
    return f"{value:+.1%}" if value is not None and value == value else "–"


if __name__ == "__main__":
    main()
