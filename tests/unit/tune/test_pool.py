"""Where a tune's tasks run: in process or in a pool of spawned processes, the results in the
tasks' order whatever order they finish in; a missing Ray or a bad executor said by name."""

from __future__ import annotations

import os
import sys
import time

import pytest

from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.tune.pool import cores, run_tasks, workers_for


def slow_square(n: int) -> tuple[int, int]:
    """The first tasks take longest, so a pool finishes them last."""
    time.sleep(0.05 * (4 - n) if n < 4 else 0)
    return n * n, os.getpid()


def test_workers_never_outnumber_the_tasks() -> None:
    assert workers_for(0, 100) == cores()
    assert workers_for(3, 2) == 2 and workers_for(1, 9) == 1 and workers_for(5, 0) == 1


@pytest.mark.parametrize("workers", [1, 2])
def test_results_come_in_the_tasks_order(workers: int) -> None:
    seen: list[int] = []
    out = run_tasks(slow_square, range(6), workers=workers, done=lambda k, r: seen.append(k))
    assert [square for square, _ in out] == [0, 1, 4, 9, 16, 25]
    assert sorted(seen) == list(range(6))  # each task reported once, as it finished
    pids = {pid for _, pid in out}
    if workers == 1:
        assert pids == {os.getpid()}
    else:  # in other processes (spawned: none is this one)
        assert os.getpid() not in pids


def test_no_tasks_and_bad_executors() -> None:
    assert run_tasks(slow_square, [], workers=2) == []
    with pytest.raises(ConfigError, match=r"tune\.executor='dask' must be one of local, ray"):
        run_tasks(slow_square, [1], executor="dask")


def test_ray_missing_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as when not installed
    with pytest.raises(ConfigError, match=r"needs Ray, an optional extra: pip install"):
        run_tasks(slow_square, [1], executor="ray")
