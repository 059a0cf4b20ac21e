"""The steps every orchestrator takes, each once: the workload, the truth (the real bench, at a
served engine when :mod:`.serving` pointed the config at one), and simulate-and-compare (Vidur on
the arrivals the real run actually sent, then the comparison).

Each step runs a stage's library ``run()`` through :class:`Stages`, which records where each
landed and how long it took in the orchestrator's own run (when it has one).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import ModelConfig, WorkloadConfig
from gpu_simulate_test.config.vidur import VidurSchedulerConfig, derived_seed
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.io.runs import Run
from gpu_simulate_test.orchestrate.configs import (
    as_resolved,
    at_run,
    compare_config,
    nested_in,
    real_bench_config,
    simulate_config,
    workload_config,
)

T = TypeVar("T")
StageRun = Callable[[T, dict[str, Any]], Path]
"""A stage's library ``run(cfg, resolved_config)``."""


@dataclasses.dataclass
class Stages:
    """Runs stages for an orchestrator: each ``run()`` given its typed config and the resolved
    config its run records; with ``record``, each stage's directory and wall time go into that
    run's ``run_meta.json`` (``stages``) and :meth:`record` adds other facts there."""

    record_in: Run | None = None
    progress: bool = False

    def run(self, name: str, call: StageRun[T], stage_cfg: T) -> Path:
        if self.progress:
            console.rule(f"[bold]{name}")
        started = time.perf_counter()
        path = call(stage_cfg, as_resolved(stage_cfg))
        if self.record_in is not None:
            stages = dict(self.record_in.meta.get("stages", {}))
            wall = round(time.perf_counter() - started, 3)
            stages[name] = {"path": str(path), "wall_time_s": wall}
            self.record_in.update_meta(stages=stages)
        return path

    def record(self, **facts: Any) -> None:
        """Facts for the orchestrator's ``run_meta.json`` (dropped when it has no run)."""
        if self.record_in is not None:
            self.record_in.update_meta(**facts)


QUIET = Stages()
"""Stage runs recorded nowhere, announced by nobody (the orchestrator reports on its own)."""


def check_trace(workload: WorkloadConfig, model: ModelConfig) -> None:
    """A trace workload (``workload.trace_file``) read before a chained stage's run directory
    exists, as the workload stage reads it: a missing or malformed trace is refused creating
    nothing, so the corrected command may take the same ``output.run_id`` (a missing trace left
    a failed run that refused it, 2026-12-07). Other workloads are drawn inside the run."""
    if workload.source == "trace":
        from gpu_simulate_test.core.traffic.workloads import generate

        generate(workload, model)


def make_workload(cfg: PipelineStageConfig, stages: Stages = QUIET) -> Path:
    """The workload of ``cfg.workload`` into ``<root>/workload/<run_id>``."""
    from gpu_simulate_test.workload.stage import run as workload_run

    return stages.run("workload", workload_run, workload_config(cfg))


def run_truth(
    cfg: PipelineStageConfig,
    workload_dir: Path | str,
    stages: Stages = QUIET,
    run_id: str | None = None,
    label: str = "real_bench",
) -> Path:
    """The real bench of ``cfg.backend`` on ``workload_dir`` into
    ``<root>/real_bench/<run_id or cfg's>``, recorded in ``stages`` as ``label``."""
    from gpu_simulate_test.real_bench.stage import run as real_bench_run

    at = cfg if run_id is None else at_run(cfg, run_id)
    return stages.run(label, real_bench_run, real_bench_config(at, workload_dir))


def simulate_and_compare(
    cfg: PipelineStageConfig,
    scheduler: VidurSchedulerConfig,
    workload_dir: Path | str,
    real_dir: Path | str,
    stages: Stages = QUIET,
    repeat_dir: Path | str | None = None,
    replaced: tuple[Path, ...] = (),
    seeds: int = 0,
    seeds_root: Path | None = None,
    at_level_dir: Path | None = None,
) -> tuple[Path, Path]:
    """Vidur on ``workload_dir`` at the arrivals the real run in ``real_dir`` sent (the load the
    engine was really offered), then the comparison (with ``repeat_dir``, a second real run of
    the workload, the truth's run-to-run difference beside it; ``replaced``: the disturbed real
    runs re-runs replaced, named by the verdict; with ``seeds``, Vidur again with as many other
    seeds, ``vidur.seed`` + 1, + 2, …, into ``seeds_root`` as ``<run_id>-seed<k>``, the range
    of the simulator's error over its own draws beside it; ``at_level_dir``: the same arrivals
    simulated at the real run's own step level, the model's error apart from the host's speed
    beside it, :func:`~.step_level.simulate_at_level`); returns (simulate, compare) run
    dirs."""
    from gpu_simulate_test.compare.stage import run as compare_run
    from gpu_simulate_test.vidur_simulate.stage import run as simulate_run

    sim_cfg = simulate_config(cfg, scheduler, workload_dir, arrivals_from=real_dir)
    sim_dir = stages.run("vidur_simulate", simulate_run, sim_cfg)
    seed_dirs = []
    for k in range(1, seeds + 1):
        at = nested_in(at_run(cfg, seed_id(cfg.output.run_id, k)), seeds_root)
        other = simulate_config(at, scheduler, workload_dir, arrivals_from=real_dir)
        vidur = dataclasses.replace(other.vidur, seed=derived_seed(other.vidur.seed, k))
        other = dataclasses.replace(other, vidur=vidur)
        seed_dirs.append(stages.run(f"vidur_simulate_seed{k}", simulate_run, other))
    compare_cfg = compare_config(cfg, real_dir, sim_dir, repeat_dir, replaced)
    compare_cfg = dataclasses.replace(
        compare_cfg,
        sim_seed_dirs=tuple(map(str, seed_dirs)),
        at_level_dir=None if at_level_dir is None else str(at_level_dir),
    )
    compare_dir = stages.run("compare", compare_run, compare_cfg)
    return sim_dir, compare_dir


def seed_id(run_id: str | None, k: int) -> str:
    """The run id of the ``k``-th other seed's simulation (``pipeline.sim_seeds``)."""
    return f"{run_id}-seed{k}"
