"""Is something else using the CPU while we time? Other processes' CPU time, measured.

A profile or an engine calibration taken while another job holds a core is wrong in a way the
numbers alone do not always show (a uniform slowdown has no inversion to find). :class:`ForeignLoad`
reads, between ``start()`` and ``stop()``, the CPU time of every process outside this one, its
descendants (a vLLM server the stage started is one of them) and its ancestors (the shell or test
runner that waits for it), and reports it in cores on average. Above
:data:`FOREIGN_CORES_LIMIT` the timing is called busy.

The hypervisor's steal time (another tenant of the host) is measured too (``steal_cores``) and
recorded, but it does not decide: on a shared cloud VM it never stops (this project's CI machine
read 0.58 cores of steal with nothing else running), so waiting for it to end, or refusing what
was timed beside it, would refuse every run there.

:func:`competitor` starts such a stranger on purpose (one spinning core), for the checks that a
busy timing is seen.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil

FOREIGN_CORES_LIMIT = 0.25
"""Average cores other processes may use while we time before the timing is called
busy: a shell, the OS and the sandbox's own agents stay well under it; one CPU-bound job is 1."""


def _own_pids() -> set[int]:
    """This process, its descendants (a server it started) and its ancestors (the shell or test
    runner waiting for it)."""
    me = psutil.Process()
    pids = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        pids.update(child.pid for child in me.children(recursive=True))
    with contextlib.suppress(psutil.Error):
        pids.update(parent.pid for parent in me.parents())
    return pids


def listening_pids(port: int) -> set[int]:
    """The process listening on TCP ``port`` of this machine and its descendants (a server the
    user started: its CPU is the engine's, not foreign); empty when it cannot be told."""
    pids: set[int] = set()
    with contextlib.suppress(psutil.Error, OSError):
        for conn in psutil.net_connections(kind="tcp"):
            at = getattr(conn.laddr, "port", None)
            if conn.status == psutil.CONN_LISTEN and at == port and conn.pid is not None:
                pids.add(conn.pid)
    for pid in list(pids):
        with contextlib.suppress(psutil.Error):
            pids.update(child.pid for child in psutil.Process(pid).children(recursive=True))
    return pids


def _foreign_cpu_s(exclude: frozenset[int] = frozenset()) -> dict[int, float]:
    """CPU seconds (user + system) of every process not ours (nor in ``exclude``), by pid."""
    mine = _own_pids() | exclude
    out: dict[int, float] = {}
    for proc in psutil.process_iter(["cpu_times"]):
        if proc.pid in mine:
            continue
        times = proc.info.get("cpu_times")
        if times is not None:
            out[proc.pid] = float(times.user + times.system)
    return out


def _steal_s() -> float:
    return float(getattr(psutil.cpu_times(), "steal", 0.0) or 0.0)


class ForeignLoad:
    """Other processes' CPU use over an interval, in cores on average (``stop()`` returns it)."""

    def __init__(self, exclude: frozenset[int] = frozenset()) -> None:
        self.exclude = exclude
        """Processes that are not foreign although not ours (a server the user runs)."""
        self._started = 0.0
        self._before: dict[int, float] = {}
        self._steal = 0.0
        self.steal_cores = 0.0
        """The hypervisor's steal over the interval, in cores (set by ``stop()``)."""

    def start(self) -> ForeignLoad:
        self._before = _foreign_cpu_s(self.exclude)
        self._steal = _steal_s()
        self._started = time.perf_counter()
        return self

    def stop(self) -> float:
        elapsed = time.perf_counter() - self._started
        after = _foreign_cpu_s(self.exclude)
        used = sum(max(0.0, t - self._before.get(pid, 0.0)) for pid, t in after.items())
        if elapsed <= 0:
            return 0.0
        self.steal_cores = max(0.0, _steal_s() - self._steal) / elapsed
        return used / elapsed


def busy_warning(what: str, cores: float) -> str | None:
    """A quality warning when ``cores`` (from :class:`ForeignLoad`) is over the limit."""
    if cores <= FOREIGN_CORES_LIMIT:
        return None
    return (
        f"{what}: other processes used {cores:.2f} core(s) on average while it was timed "
        f"(limit {FOREIGN_CORES_LIMIT}); its times are probably too slow"
    )


QUIET_CHECK_S = 1.0
"""How long each look at the machine lasts while waiting for it to go quiet."""


def wait_for_quiet(budget_s: float, check_s: float = QUIET_CHECK_S) -> tuple[bool, float]:
    """Look at the machine ``check_s`` at a time until other processes use no more than
    :data:`FOREIGN_CORES_LIMIT`, for ``budget_s`` at most; returns whether it went quiet and
    the seconds waited. A busy timing is better repeated after the other job than beside it."""
    started = time.perf_counter()
    while True:
        load = ForeignLoad().start()
        time.sleep(check_s)
        if load.stop() <= FOREIGN_CORES_LIMIT:
            return True, time.perf_counter() - started
        if time.perf_counter() - started >= budget_s:
            return False, time.perf_counter() - started


def _descendant_cpu_s() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of this process and every descendant, by pid, with a label:
    ``client`` for this process, else the process's name (vLLM names its engine
    ``VLLM::EngineCore``; its API server is the ``python`` this process started)."""
    me = psutil.Process()
    out: dict[int, tuple[str, float]] = {}
    procs = [me]
    with contextlib.suppress(psutil.Error):
        procs += me.children(recursive=True)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            times = proc.cpu_times()
            label = "client" if proc.pid == me.pid else proc.name()
            out[proc.pid] = (label, float(times.user + times.system))
    return out


def run_delay_s(pid: int) -> float | None:
    """Seconds the threads of ``pid`` have spent ready to run but waiting for a CPU (the sum of
    ``/proc/<pid>/task/*/schedstat``'s second field); None where the kernel does not tell."""
    total = 0
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[1])
    return total / 1e9


class OwnLoad:
    """CPU used by this process and each process it started, over an interval, in cores on
    average (``stop()`` returns ``label[pid]`` → cores): who of the client, the API server and
    the engine used the machine."""

    def __init__(self) -> None:
        self._before: dict[int, tuple[str, float]] = {}
        self._delay_before: float | None = None
        self._started = 0.0
        self.client_run_delay_s: float | None = None
        """Seconds this process's threads waited for a CPU while ready to run, over the
        interval (set by ``stop()``; None where the kernel does not tell)."""

    def start(self) -> OwnLoad:
        self._before = _descendant_cpu_s()
        self._delay_before = run_delay_s(os.getpid())
        self._started = time.perf_counter()
        return self

    def stop(self) -> dict[str, float]:
        elapsed = time.perf_counter() - self._started
        if elapsed <= 0:
            return {}
        delay = run_delay_s(os.getpid())
        if delay is not None and self._delay_before is not None:
            self.client_run_delay_s = delay - self._delay_before
        out: dict[str, float] = {}
        for pid, (label, cpu) in _descendant_cpu_s().items():
            used = cpu - self._before.get(pid, (label, 0.0))[1]
            out[label if label == "client" else f"{label}[{pid}]"] = round(used / elapsed, 3)
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


@contextlib.contextmanager
def competitor(seconds: float) -> Iterator[int]:
    """A CPU-bound process that is not this one's child (the shell that starts it exits), bounded
    by ``timeout`` and stopped on the way out. The pid is ``timeout``'s: SIGTERM to it reaches
    the spinning child too (SIGKILL would leave the child spinning, orphaned)."""
    spin = f"timeout {max(1, int(seconds))} '{sys.executable}' -c 'while True: pass'"
    out = subprocess.run(
        ["sh", "-c", f"{spin} >/dev/null 2>&1 & echo $!"],
        capture_output=True,
        text=True,
        check=True,
    )
    pid = int(out.stdout.strip())
    try:
        yield pid
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
