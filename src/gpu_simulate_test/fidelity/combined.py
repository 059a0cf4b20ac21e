"""Fidelity reports taken together: a multirun's combined report, and ``fidelity.summarize``.

The Hydra callback in :mod:`gpu_simulate_test.cli.fidelity` calls :func:`write_combined_report`
once every job of a multirun has returned (one job per backend, model or preset); this module
knows nothing of Hydra.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from gpu_simulate_test.config.fidelity import FidelityStageConfig
from gpu_simulate_test.config.schema import OutputConfig
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.fidelity import contract
from gpu_simulate_test.fidelity.report import summary_table
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import (
    ArtifactError,
    atomic_open,
    read_json,
    write_csv,
    write_json,
)
from gpu_simulate_test.io.runs import RunExistsError, default_run_id, multirun_jobs, start_run


def read_report(path: str | Path) -> dict[str, Any]:
    """A fidelity report: a fidelity run directory (its ``fidelity.json``), a ``fidelity.json``
    or an older harness report (``<name>-fidelity.json``, no schema version)."""
    p = Path(path)
    if p.is_dir():
        if not (p / contract.FIDELITY_JSON).is_file():
            raise ArtifactError(
                f"{p}: no {contract.FIDELITY_JSON} (a fidelity run of phase real has none: "
                "simulate it with fidelity.phase=sim first)"
            )
        p = p / contract.FIDELITY_JSON
    report = read_json(p, required_keys=("name", "rows"))
    for index, row in enumerate(report["rows"]):
        missing = [k for k in ("backend", "abs_rel_error") if k not in row]
        if missing:
            raise ArtifactError(f"{p}: rows[{index}] has no {missing[0]!r}")
    report["path"] = str(p)
    return report


def combined_markdown(title: str, reports: Sequence[Mapping[str, Any]], base: Path) -> str:
    """One table over the reports (per report and backend), then each report's setup line and
    latency-vs-load plots, linked relative to ``base`` (where the markdown is written)."""
    lines = [f"# {title}", "", summary_table(reports), ""]
    images = []
    for report in reports:
        where = Path(report["path"])
        partial = " (**partial**: " + "; ".join(report.get("notes") or []) + ")"
        lines.append(
            f"- {report['name']}: {report.get('device', '?')}, "
            f"{report.get('requests_per_load', '?')} requests per load; "
            f"[{where.name}]({os.path.relpath(where, base)})"
            + (partial if report.get("partial") else "")
        )
        for backend in report.get("capacity", {}):
            plot = where.parent / contract.plot_name(str(backend))
            if not plot.is_file():  # the argparse harness's reports
                plot = where.parent / f"{report['name']}-{backend}-latency-vs-load.png"
            if plot.is_file():
                images.append(f"![{report['name']} {backend}]({os.path.relpath(plot, base)})")
    lines += ["", *images, ""] if images else [""]
    return "\n".join(lines)


def _rows(reports: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    frames = []
    for report in reports:
        frame = pd.DataFrame(report["rows"])
        if "clock" not in frame.columns:  # a report older than the two clocks
            frame.insert(list(frame.columns).index("metric"), "clock", "client")
        frame.insert(0, "report", str(report["name"]))
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def summarize(cfg: FidelityStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """``fidelity.summarize=[...]``: ``summary.md`` (and the rows as ``fidelity.csv`` with a
    ``report`` column first) in a run of its own; the table is printed too."""
    reports = [read_report(p) for p in cfg.fidelity.summarize]  # every input before the run
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    with start_run(cfg.output.root, "fidelity", run_id, resolved_config, cfg.output.overwrite) as r:
        text = combined_markdown(f"Fidelity summary: {run_id}", reports, r.path)
        with atomic_open(r.file(contract.SUMMARY_MD)) as handle:
            handle.write(text)
        _write_rows(r.file(contract.FIDELITY_CSV), reports)
        r.update_meta(summarized=[rep["path"] for rep in reports])
    print(summary_table(reports))
    return r.path


def _write_rows(path: Path, reports: Sequence[Mapping[str, Any]]) -> None:
    rows = _rows(reports)
    columns = ["report", *contract.FIDELITY_TABLE.column_names]
    extra = [c for c in rows.columns if c not in columns]
    write_csv(path, rows[columns + extra], contract.FIDELITY_TABLE_WITH_REPORT)


def combined_dir(output: OutputConfig) -> Path | None:
    """``<root>/fidelity/<run_id>-combined``, where a multirun's report lands; None without a
    run id."""
    if not output.run_id:
        return None
    return layout.run_dir(output.root, "fidelity", f"{output.run_id}-{contract.COMBINED_SUFFIX}")


def check_combined_free(output: OutputConfig) -> None:
    """Refuse, before any job runs, when the combined report's directory exists already."""
    path = combined_dir(output)
    if path is not None and path.exists() and not output.overwrite:
        raise RunExistsError(
            f"{path} already exists, where this multirun's combined report would go; nothing "
            "was run (choose another output.run_id, pass output.overwrite=true or "
            "hydra.callbacks.combined_report.enabled=false)"
        )


def write_combined_report(
    output: OutputConfig, started: datetime, progress: bool = True
) -> Path | None:
    """The multirun's jobs' reports as one (``report.md``, ``combined.json``, ``fidelity.csv``)
    in ``<root>/fidelity/<run_id>-combined``; None without a run id or with fewer than two
    jobs that wrote a report."""
    path = combined_dir(output)
    if path is None or not output.run_id:
        return None
    jobs = multirun_jobs(output.root, "fidelity", output.run_id, started)
    runs = [p for p in jobs if (p / contract.FIDELITY_JSON).is_file()]  # phase=real has none
    if len(runs) < 2:
        return None
    reports = [read_report(p) for p in runs]
    run_id = path.name
    config = {"jobs": [str(p) for p in runs]}
    with start_run(output.root, "fidelity", run_id, config, output.overwrite) as r:
        text = combined_markdown(f"Fidelity, combined: {output.run_id}", reports, r.path)
        with atomic_open(r.file(contract.REPORT_MD)) as handle:
            handle.write(text)
        _write_rows(r.file(contract.FIDELITY_CSV), reports)
        write_json(
            r.file(contract.COMBINED_JSON),
            {
                "schema_version": contract.FIDELITY_SCHEMA_VERSION,
                "jobs": [str(p) for p in runs],
                "largest_abs_error_by_job": {
                    str(rep["name"]): rep.get("largest_abs_error") for rep in reports
                },
                "partial_jobs": [str(rep["name"]) for rep in reports if rep.get("partial")],
            },
        )
    if progress:
        console.print(f"[bold]combined report:[/] {r.file(contract.REPORT_MD)}")
    return r.path
