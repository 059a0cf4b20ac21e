"""Where a tune's independent simulations run: in this process, in a local pool of processes
(``tune.executor=local``, one per core by default), or on a Ray cluster (``tune.executor=ray``,
as Vidur-Search runs its search). Each task is a module-level function and its argument; the
results come back in the order of the tasks, whatever order they finish in, so an answer never
depends on where it ran."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any, TypeVar

from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.tune import TUNE_EXECUTORS as EXECUTORS

T = TypeVar("T")
R = TypeVar("R")

RAY_EXTRA = "pip install 'gpu-simulate-test[ray]'"


def cores() -> int:
    """The cores this process may run on (its affinity where the platform says, else all)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - macOS and Windows have no affinity call
        return max(1, os.cpu_count() or 1)


def workers_for(requested: int, tasks: int) -> int:
    """Processes for ``tasks`` tasks: ``requested`` (0: one per core), never more than the
    tasks, at least one."""
    wanted = requested if requested > 0 else cores()
    return max(1, min(wanted, tasks))


def run_tasks(
    fn: Callable[[T], R],
    tasks: Sequence[T],
    *,
    workers: int = 1,
    executor: str = "local",
    address: str = "",
    done: Callable[[int, R], None] = lambda k, r: None,
) -> list[R]:
    """``fn`` of every task, in the tasks' order; ``done(k, result)`` as each finishes (for a
    progress bar). ``executor=local`` runs them in this process when one worker (or one task)
    suffices, else in a pool of ``workers`` spawned processes (0: one per core);
    ``executor=ray`` as Ray tasks on the cluster at ``address`` (empty: a local one started for
    this call and stopped after it)."""
    if executor not in EXECUTORS:
        raise ConfigError(f"tune.executor={executor!r} must be one of {', '.join(EXECUTORS)}")
    if not tasks:
        return []
    if executor == "ray":
        return on_ray(fn, tasks, address, done)
    count = workers_for(workers, len(tasks))
    if count == 1:
        results = []
        for k, task in enumerate(tasks):
            results.append(fn(task))
            done(k, results[-1])
        return results
    # spawn: a fork would copy this process's threads (torch's, the progress bar's) mid-state
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=count, mp_context=context) as pool:
        futures = {pool.submit(fn, task): k for k, task in enumerate(tasks)}
        out: dict[int, R] = {}
        pending: set[Future[R]] = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                k = futures[future]
                out[k] = future.result()
                done(k, out[k])
    return [out[k] for k in range(len(tasks))]


def on_ray(
    fn: Callable[[T], R], tasks: Sequence[T], address: str, done: Callable[[int, R], None]
) -> list[R]:
    """The tasks as Ray tasks: on the cluster at ``address``, else on a local cluster started
    here (one worker per core) and stopped after. The cluster's workers import this package,
    work from this directory and read the tune's bundle and workload by the paths given here: a
    remote cluster's nodes need the package installed and this directory mounted at the same
    path (docs/tune.md)."""
    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address or None, log_to_driver=False, include_dashboard=False)
    try:
        remote = ray.remote(in_directory)
        here = os.getcwd()
        refs = [remote.remote(here, fn, task) for task in tasks]
        index = {ref: k for k, ref in enumerate(refs)}
        out: dict[int, Any] = {}
        pending = list(refs)
        while pending:
            finished, pending = ray.wait(pending, num_returns=1)
            for ref in finished:
                k = index[ref]
                out[k] = ray.get(ref)
                done(k, out[k])
        return [out[k] for k in range(len(tasks))]
    finally:
        if started:
            ray.shutdown()


def in_directory(where: str, fn: Callable[[T], R], task: T) -> R:
    """``fn(task)`` run from ``where`` (a Ray worker starts in its session's folder; the tune's
    paths are the caller's, relative to its directory)."""
    os.chdir(where)
    return fn(task)


def import_ray() -> Any:
    """Ray, or a ConfigError saying how to install it (it is an optional extra)."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            f"tune.executor=ray needs Ray, an optional extra: {RAY_EXTRA} (or "
            "tune.executor=local, a pool of this machine's cores)"
        ) from None
    return ray
