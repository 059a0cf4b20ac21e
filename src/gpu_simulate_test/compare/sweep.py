"""Sweep report: several compare runs (one per load level) as one table and one plot."""

from __future__ import annotations

import glob
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import plots
from gpu_simulate_test.compare.contract import (
    COMPARISON_JSON,
    COMPARISON_PERCENTILES,
    PERCENTILES_CSV,
    SWEEP_CSV,
    SWEEP_JSON,
    SWEEP_MD,
    SWEEP_PLOT,
    SWEEP_TABLE,
)
from gpu_simulate_test.config.compare import CompareStageConfig
from gpu_simulate_test.core.reporting import console, print_table
from gpu_simulate_test.io.artifacts import ArtifactError, read_csv, read_json, write_csv, write_json
from gpu_simulate_test.io.runs import default_run_id, open_upstream_run, start_run

SWEEP_STATS: tuple[str, ...] = ("p50", "p90", "p99")
SWEEP_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e")
X_LABELS: Mapping[str, str] = MappingProxyType(
    {
        "offered_qps": "offered load (requests/s)",
        "batch_size_cap": "batch cap (requests)",
        "run": "run (order given)",
    }
)


def expand_dirs(patterns: Sequence[str]) -> list[Path]:
    """Expand glob patterns (sorted, duplicates dropped); a pattern matching nothing fails."""
    out: list[Path] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
        if not matches:
            raise ArtifactError(f"sweep_dirs: {pattern!r} matches no directory")
        out += [Path(p) for p in matches if Path(p) not in out]
    return out


def _load_level(path: Path, comparison: Mapping[str, Any], axis: str, index: int) -> float:
    """The run's x on the sweep's axis; a field that is not a number fails, naming it."""
    if axis == "offered_qps":
        value, name = comparison.get("offered_qps"), "offered_qps"
    elif axis == "batch_size_cap":
        setup = comparison.get("setup")
        sim = setup.get("sim") if isinstance(setup, Mapping) else None
        scheduler = sim.get("scheduler") if isinstance(sim, Mapping) else None
        value = scheduler.get("batch_size_cap") if isinstance(scheduler, Mapping) else None
        name = "setup.sim.scheduler.batch_size_cap"
    else:
        return float(index)
    if value is None:
        return float("nan")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ArtifactError(
            f"{path / COMPARISON_JSON}: field {name!r} is {value!r}, expected a number"
        )
    return float(value)


def sweep_table(
    runs: Sequence[tuple[Path, Mapping[str, Any], pd.DataFrame]], axis: str
) -> pd.DataFrame:
    """One row per run, metric and statistic (pure: the runs are already read)."""
    rows = []
    for index, (path, comparison, percentiles) in enumerate(runs):
        load = _load_level(path, comparison, axis, index)
        keep = percentiles["metric"].isin(SWEEP_METRICS) & percentiles["stat"].isin(
            (*SWEEP_STATS, "mean")
        )
        for rec in percentiles[keep].to_dict("records"):
            rows.append(
                {
                    "compare_dir": str(path),
                    "load": load,
                    "metric": rec["metric"],
                    "stat": rec["stat"],
                    "real_ms": rec["real_ms"],
                    "sim_ms": rec["sim_ms"],
                    "signed_rel_error": rec["signed_rel_error"],
                }
            )
    return pd.DataFrame(rows).sort_values(["metric", "stat", "load"], kind="stable")


def markdown(table: pd.DataFrame, axis: str, workloads: Mapping[str, str]) -> str:
    """``sweep.md``: latency vs the sweep's x, real vs simulated, error per level, and the plot."""
    x = X_LABELS[axis]
    what = x.split(" (")[0]
    lines = [
        f"# Sweep: latency vs {what}, real vs simulated",
        "",
        f"x axis: {x}; error = simulated / real − 1.",
        "",
        "| metric | stat | " + " | ".join([what, "run", "real (ms)", "sim (ms)", "error"]) + " |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for rec in table[table["stat"] != "mean"].to_dict("records"):
        err = rec["signed_rel_error"]
        lines.append(
            f"| {rec['metric']} | {rec['stat']} | {rec['load']:.3g} | "
            f"`{Path(rec['compare_dir']).name}` | {rec['real_ms']:.2f} | "
            f"{rec['sim_ms']:.2f} | {f'{err:+.1%}' if np.isfinite(err) else '–'} |"
        )
    lines += ["", "Runs: " + ", ".join(f"`{d}` ({w})" for d, w in workloads.items()), ""]
    lines += [f"![latency vs {what}]({SWEEP_PLOT})", ""]
    return "\n".join(lines)


def shared_x(
    runs: Sequence[tuple[Path, Mapping[str, Any], Any]], axis: str
) -> tuple[Path, Path, float] | None:
    """The first two runs that sit at one x (their rows and points could not be told apart)."""
    seen: dict[float, Path] = {}
    for index, (path, comparison, _) in enumerate(runs):
        x = _load_level(path, comparison, axis, index)
        if x in seen:
            return seen[x], path, x
        seen[x] = path
    return None


def run_sweep(
    cfg: CompareStageConfig, resolved_config: Mapping[str, Any], order_if_shared: bool = False
) -> Path:
    """Read every compare run, then write the sweep table, JSON, markdown and plot.

    Two runs at one x are refused, or with ``order_if_shared`` (a pipeline multirun over some
    other knob) put in the order given (``sweep_x=run``), saying so."""
    runs = []
    workloads: dict[str, str] = {}
    named = {Path(p) for p in cfg.sweep_dirs if not glob.has_magic(p)}
    for path in expand_dirs(cfg.sweep_dirs):
        meta = open_upstream_run(path, "compare")
        if meta.get("kind") == "sweep":
            if path in named:
                raise ArtifactError(f"sweep_dirs: {path} is a sweep report, not a compare run")
            continue  # an earlier sweep report matched by the same glob
        comparison = read_json(path / COMPARISON_JSON, required_keys=("offered_qps", "setup"))
        percentiles = read_csv(path / PERCENTILES_CSV, COMPARISON_PERCENTILES)
        runs.append((path, comparison, percentiles))
        workloads[str(path)] = str(meta.get("workload_id"))
    if len(runs) < 2:
        raise ArtifactError("a sweep report needs at least two compare runs in sweep_dirs")
    axis = cfg.compare.sweep_x
    if (shared := shared_x(runs, axis)) is not None:
        first, second, x = shared
        why = f"{first} and {second} both have {axis}={x:g}"
        if not order_if_shared:
            raise ArtifactError(
                f"sweep_dirs: {why}; a sweep needs one run per x (compare.sweep_x=run keeps "
                "every run, in the order given)"
            )
        console.print(f"sweep report: {why}, so its x is the run, in job order")
        axis = "run"
    table = sweep_table(runs, axis)
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    sources = [p for p, _, _ in runs]
    with start_run(
        cfg.output.root, "compare", run_id, resolved_config, cfg.output.overwrite, sources
    ) as r:
        r.update_meta(kind="sweep", sweep_dirs=[str(p) for p in sources], sweep_x=axis)
        write_csv(r.file(SWEEP_CSV), table, SWEEP_TABLE)
        write_json(r.file(SWEEP_JSON), {"sweep_x": axis, "rows": table.to_dict("records")})
        plots.plot_sweep(table, r.file(SWEEP_PLOT), X_LABELS[axis], SWEEP_STATS)
        with open(r.file(SWEEP_MD), "w", encoding="utf-8") as handle:
            handle.write(markdown(table, axis, workloads))
    if cfg.progress:
        shown = table[table["stat"] == "p90"]
        print_table(
            f"sweep of {len(runs)} compare runs (p90, ms; x = {X_LABELS[axis]})",
            ["metric", X_LABELS[axis].split(" (")[0], "real", "simulated", "error"],
            [
                [
                    str(rec["metric"]),
                    f"{rec['load']:.3g}",
                    f"{rec['real_ms']:.2f}",
                    f"{rec['sim_ms']:.2f}",
                    f"{rec['signed_rel_error']:+.1%}",
                ]
                for rec in shown.to_dict("records")
            ],
        )
        console.print(f"[bold]artifacts:[/] {r.path}")
    return r.path
