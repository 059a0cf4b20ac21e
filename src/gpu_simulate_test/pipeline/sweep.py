"""The sweep report at the end of a pipeline multirun: the compare runs its jobs wrote, as one.

The Hydra callback in :mod:`gpu_simulate_test.cli.pipeline` calls :func:`write_sweep_report`
once every job has returned; this module knows nothing of Hydra.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from gpu_simulate_test.compare.sweep import run_sweep
from gpu_simulate_test.config.compare import CompareOptions, CompareStageConfig
from gpu_simulate_test.config.schema import OutputConfig
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.runs import RunExistsError, multirun_jobs
from gpu_simulate_test.pipeline.contract import SWEEP_SUFFIX


def sweep_report_dir(output: OutputConfig) -> Path | None:
    """``<root>/compare/<run_id>-sweep``, where a multirun's report lands; None without a run id."""
    if not output.run_id:
        return None
    return layout.run_dir(output.root, "compare", f"{output.run_id}-{SWEEP_SUFFIX}")


def check_sweep_report_free(output: OutputConfig) -> None:
    """Refuse, before the multirun's jobs run, when its report directory exists already (and
    ``output.overwrite`` is false): the report would fail only after every job had run."""
    path = sweep_report_dir(output)
    if path is not None and path.exists() and not output.overwrite:
        raise RunExistsError(
            f"{path} already exists, where this multirun's sweep report would go; nothing was "
            "run (choose another output.run_id, pass output.overwrite=true or "
            "hydra.callbacks.sweep_report.enabled=false)"
        )


def write_sweep_report(
    output: OutputConfig, options: CompareOptions, since: datetime, progress: bool = True
) -> Path | None:
    """Report the compare runs of the multirun that began at ``since``; None when fewer than two
    jobs completed or the jobs had no common ``output.run_id`` to find them by."""
    if not output.run_id:
        return None
    dirs = multirun_jobs(output.root, "compare", output.run_id, since)
    if len(dirs) < 2:
        return None
    cfg = CompareStageConfig(
        sweep_dirs=tuple(str(d) for d in dirs),
        compare=options,
        output=OutputConfig(
            root=output.root,
            run_id=f"{output.run_id}-{SWEEP_SUFFIX}",
            overwrite=output.overwrite,
        ),
        progress=progress,
    )
    resolved: dict[str, Any] = {
        "sweep_dirs": list(cfg.sweep_dirs),
        "compare": {"plots": options.plots, "sweep_x": options.sweep_x},
        "output": {"root": output.root, "run_id": cfg.output.run_id},
    }
    return run_sweep(cfg, resolved, order_if_shared=True)
