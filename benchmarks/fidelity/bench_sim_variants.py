"""Stored main jobs simulated again under other settings: which setting brings the client's
first tokens closer, judged on truths it was not calibrated on?

Each RUN is a pipeline run id (``tmp/pipeline/<RUN>``, e.g. from ``bench_fresh_profiles``): its
real run, its repeat and its workload are read back; the simulation and the comparison are made
again, once per variant, with the run's own bundle (the ``vidur_profile`` path its pipeline
recorded; ``bench_fresh_profiles`` gives each run its own profiling root), so every variant of a
run sees that run's calibration and a difference between variants is the setting's. A variant
may name another ``profiling_root`` (e.g. an older view of each bundle). Per variant
and run: client TTFT p50 / p90 / p99 error with the truth's own repeat beside, the front end
(client − engine TTFT) real / simulated; per variant the mean signed error and how many runs are
within max(10%, real vs real).

Run: ``python -m benchmarks.fidelity.bench_sim_variants RUN [RUN ...]
--variant NAME=OVERRIDE[,OVERRIDE] [--variant ...] [--out F.json]``; the variant ``as_is``
(no overrides) is always run first.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.fidelity.bench_fresh_profiles import (
    QUANTILES,
    error_cell,
    fmt,
    front_cells,
    judged,
)
from gpu_simulate_test.fidelity.bounds import LIMIT


def pipeline_config(overrides: list[str]) -> Any:
    from hydra import compose, initialize_config_dir

    from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
    from gpu_simulate_test.config.pipeline import PipelineStageConfig
    from gpu_simulate_test.config.registry import to_typed

    register_configs()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        composed = compose("pipeline", overrides=overrides)
    return to_typed(composed, PipelineStageConfig)


def stored_run(run: str) -> tuple[dict[str, Any], Any, Path]:
    """A stored pipeline run (``tmp/pipeline/<run>``): its ``run_meta.json``, the scheduler its
    simulation ran with (a ``VidurSchedulerConfig``) and the profiling root of its own bundle
    (the bundle sits at ``<profiling_root>/<hardware>/<model>``: this run's own calibration)."""
    from gpu_simulate_test.config.vidur import VidurSchedulerConfig

    meta = json.loads((Path("tmp") / "pipeline" / run / "run_meta.json").read_text())
    stages = meta["stages"]
    sim_meta = json.loads((Path(stages["vidur_simulate"]["path"]) / "run_meta.json").read_text())
    scheduler = VidurSchedulerConfig(**sim_meta["config"]["vidur"]["scheduler"])
    return meta, scheduler, Path(stages["vidur_profile"]["path"]).parent.parent


def one(run: str, variant: str, overrides: list[str]) -> dict[str, Any]:
    from gpu_simulate_test.orchestrate.steps import simulate_and_compare

    meta, scheduler, root = stored_run(run)
    stages = meta["stages"]
    cfg = pipeline_config(
        [
            f"profiling_root={root}",
            *overrides,
            f"output.run_id=variant-{variant}-{run}",
            "output.overwrite=true",
            "progress=false",
        ]
    )
    repeat = (stages.get("real_bench_repeat") or {}).get("path")
    _, compare_dir = simulate_and_compare(
        cfg,
        scheduler,
        stages["workload"]["path"],
        stages["real_bench"]["path"],
        repeat_dir=repeat,
    )
    data = json.loads((Path(compare_dir) / "comparison.json").read_text())
    ttft = {
        row["stat"]: {
            "error": row.get("error_vs_client"),
            "real_vs_real": row.get("noise_vs_client"),
        }
        for row in data["clocks"]
        if row["metric"] == "ttft"
    }
    return {
        "run": run,
        "variant": variant,
        "ttft": ttft,
        "front_end": (data.get("ttft_parts") or {}).get("front_end"),
    }


def report(results: list[dict[str, Any]]) -> None:
    for variant in dict.fromkeys(r["variant"] for r in results):
        rows = [r for r in results if r["variant"] == variant]
        print(f"\n### {variant}\n")
        print("| run | client TTFT p50 | p90 | p99 | front end p50 real / sim (ms) | p90 | p99 |")
        print("|" + " --- |" * 7)
        for r in rows:
            cells = [error_cell(r["ttft"].get(q)) for q in QUANTILES]
            print(f"| {r['run']} | " + " | ".join(cells + front_cells(r.get("front_end"))) + " |")
        for q in QUANTILES:
            within, count, mean = judged([r["ttft"].get(q) for r in rows])
            print(
                f"- client TTFT {q}: mean signed {fmt(mean)}, within max({LIMIT:.0%}, real vs "
                f"real) in {within} of {count}"
            )
        if (line := pooled_line(variant, [r["run"] for r in rows])) is not None:
            print(line)


def pooled_line(variant: str, runs: list[str], root: Path = Path("tmp")) -> str | None:
    """Each request's front end (client − engine TTFT) over the runs' requests together, the
    variant's simulations (``<root>/vidur_simulate/variant-<variant>-<run>``, as :func:`one`
    names them) against each run's truth and its repeat (:func:`~gpu_simulate_test.compare.
    front_end.pooled`); None where no run is left under ``root``."""
    import pandas as pd

    from benchmarks.fidelity.bench_fresh_profiles import front_end_sides
    from gpu_simulate_test.compare import front_end

    sides: list[dict[str, pd.Series]] = []
    for run in runs:
        stored = front_end_sides(run, root)
        table = root / "vidur_simulate" / f"variant-{variant}-{run}" / "request_metrics.csv"
        if stored is None or not table.is_file():
            continue
        kept: dict[str, pd.Series] = {k: stored[k] for k in ("real", "repeat") if k in stored}
        sides.append({**kept, "sim": front_end.sim_front_end_s(pd.read_csv(table))})
    record = front_end.pooled(sides) if sides else None
    if record is None:
        return None
    cells = " / ".join(fmt(record["sim_vs_real"][q]) for q in ("p50", "p90", "p99"))
    line = (
        f"- each request's front end pooled ({len(sides)} runs, {record['requests']} requests) "
        f"p50 / p90 / p99: {cells} (mean {fmt(record['sim_vs_real']['mean'])})"
    )
    if "repeat_vs_real" in record:
        again = " / ".join(fmt(record["repeat_vs_real"][q]) for q in ("p50", "p90", "p99"))
        line += f"; the truth's repeat {again}"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="*")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME=OVERRIDE[,OVERRIDE...]")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--from", dest="stored", type=Path, default=None)
    args = parser.parse_args()
    if args.stored:
        report(json.loads(args.stored.read_text())["results"])
        return
    variants: dict[str, list[str]] = {"as_is": []}
    for text in args.variant:
        name, _, overrides = text.partition("=")
        variants[name] = [o for o in overrides.split(",") if o]
    results = [one(run, name, ov) for name, ov in variants.items() for run in args.runs]
    report(results)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
        command = ["python -m benchmarks.fidelity.bench_sim_variants", *sys.argv[1:]]
        args.out.write_text(
            json.dumps({"command": " ".join(command), "date": stamp, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
