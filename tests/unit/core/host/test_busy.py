"""Other processes' CPU use is measured while we time, and a busy timing is called busy."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpu_simulate_test.core.host.busy import (
    FOREIGN_CORES_LIMIT,
    ForeignLoad,
    _foreign_cpu_s,
    _own_pids,
    busy_warning,
)
from gpu_simulate_test.core.host.busy import competitor as spinning

# other processes' CPU use is measured, and a parallel worker is one: run alone
pytestmark = pytest.mark.timing


@pytest.fixture
def competitor():
    """A CPU-bound process that is not ours (the benchmark's: its parent shell exits)."""
    with spinning(60) as pid:
        time.sleep(0.2)
        yield pid


def test_a_cpu_bound_stranger_is_seen(competitor: int) -> None:
    load = ForeignLoad().start()
    time.sleep(1.0)
    cores = load.stop()
    assert cores > 0.5  # one spinning process is about one core
    warning = busy_warning("profile", cores)
    assert warning is not None and "other processes used" in warning


def test_our_own_children_are_not_foreign(competitor: int) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        mine = _own_pids()
        assert child.pid in mine and os.getpid() in mine
        assert competitor not in mine  # reparented: not ours
        assert child.pid not in _foreign_cpu_s() and competitor in _foreign_cpu_s()
    finally:
        child.kill()
        child.wait()


def test_under_the_limit_is_quiet() -> None:
    assert busy_warning("profile", FOREIGN_CORES_LIMIT) is None
