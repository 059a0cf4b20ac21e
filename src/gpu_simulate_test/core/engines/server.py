"""A serving process this stage starts on 127.0.0.1 and stops by pid: vLLM or transformers serve.

The server runs in its own process group (``process_group=0``), so stopping it stops every
process it spawned (vLLM's engine core and workers too): SIGTERM to the group, then SIGKILL. It
stays in the caller's session on purpose: with the kernel's autogroup scheduling
(``kernel.sched_autogroup_enabled=1``, the default of most distributions) a new session is a CPU
group of its own, and vLLM's engine core, which spins with ``sched_yield()`` while it waits for
its worker's step, then held the client's core against the client's threads: requests were sent
up to 99 ms late and token streams were delivered in bursts (``sched_yield`` gives way only
inside a group). In one session, all late sends and held-back streams went away
(``benchmarks/results/truth_stalls.md``).
Its output goes through a pipe that a reader thread copies into the log file, stamping each line
with ``time.perf_counter()`` as it arrives; a hook sees every line with its stamp (the vLLM backend
takes its per-step log from there). A hook that raises is stopped, said and kept
(:class:`GuardedHook`), and the log goes on being copied.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.markup import escape

from gpu_simulate_test.core.reporting import console

LineHook = Callable[[str, float], None]
"""Called with each line of server output (no newline) and the ``perf_counter`` it arrived at;
it handles lines it cannot read itself (:meth:`.vllm_log.StepLog.feed` counts them)."""

ERROR_LINE = re.compile(r"\b[A-Z]\w*(?:Error|Exception): .+$")
STOP_GRACE_S = 15.0
FOLLOW_POLL_S = 0.005
"""How often a followed log file is checked for new lines."""
"""How long a stopped server may take to exit after SIGTERM before it is killed."""


class ServerError(RuntimeError):
    """The server did not start or died; the message carries the last lines of its log."""


class GuardedHook:
    """A line hook as a log reader calls it: the first exception it raises is kept
    (:attr:`error`) and printed as a warning, and the hook is not called again, so that a broken
    hook neither stops the reader (a server whose output pipe is not drained blocks) nor vanishes
    (the vLLM backend fails its run with :attr:`error`)."""

    def __init__(self, hook: LineHook) -> None:
        self._hook: LineHook | None = hook
        self.error: str | None = None

    def __call__(self, line: str, at: float) -> None:
        if self._hook is None:
            return
        try:
            self._hook(line, at)
        except Exception as exc:
            self._hook = None
            self.error = f"{type(exc).__name__}: {exc} (on the line {line[:200]!r})"
            console.print(
                f"[yellow]warning:[/] the server log's line hook failed and reads no more lines: "
                f"{escape(self.error)}",
                soft_wrap=True,
            )


PORT_ATTEMPTS = 3
"""Starts on a port picked here before giving up (:func:`start_on_loopback`)."""


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (:func:`start_on_loopback` starts a
    server again where another process took it meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int) -> bool:
    """Whether something already listens on 127.0.0.1:``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


class ManagedServer:
    """One server process: start it, wait for its health URL, watch it, stop it by pid."""

    def __init__(
        self,
        command: Sequence[str],
        log_path: Path,
        env: Mapping[str, str] | None = None,
        hook: LineHook | None = None,
    ) -> None:
        self.command = [str(c) for c in command]
        self.log_path = log_path
        self.env = dict(env) if env is not None else dict(os.environ)
        self.hook = GuardedHook(hook) if hook is not None else None
        self.process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self) -> None:
        """Spawn the server in a new process group of this session (the client's CPU group: see
        the module docstring), its output piped through the reader thread."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=self.env,
            process_group=0,
        )
        self._reader = threading.Thread(target=self._pump, name="server-log", daemon=True)
        self._reader.start()

    def _pump(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        with self.log_path.open("ab") as log:
            for raw in iter(self.process.stdout.readline, b""):
                now = time.perf_counter()
                log.write(raw)
                log.flush()
                if self.hook is not None:
                    self.hook(raw.decode(errors="replace").rstrip("\r\n"), now)

    def failure(self) -> str | None:
        """Why the server is not running (None while it runs)."""
        if self.process is None:
            return "server not started"
        code = self.process.poll()
        if code is None:
            return None
        return f"server process {self.process.pid} exited with code {code}"

    def log_tail(self, lines: int = 25) -> str:
        """The last ``lines`` lines of the server's log."""
        if not self.log_path.is_file():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def first_error(self) -> str | None:
        """The first ``SomethingError: message`` in the log: usually the root cause, where the
        last lines only show the API server giving up."""
        if not self.log_path.is_file():
            return None
        lines = self.log_path.read_text(errors="replace").splitlines()
        # a WARNING that names an error it might cause (vLLM's ulimit one names Errno 24) is
        # not what went wrong: errors first, then anything
        for candidates in ([ln for ln in lines if " WARNING " not in ln], lines):
            for line in candidates:
                if m := ERROR_LINE.search(line):
                    return m.group(0).strip()
        return None

    def lost_its_port(self) -> bool:
        """Whether the server exited because its port was taken (``Address already in use``
        anywhere in its log: an earlier error line may come first)."""
        if self.failure() is None or not self.log_path.is_file():
            return False
        return "Address already in use" in self.log_path.read_text(errors="replace")

    def wait_healthy(self, url: str, timeout_s: float) -> float:
        """Poll ``url`` until it answers 200; returns the seconds it took.

        Raises :class:`ServerError` with the log's last lines when the process exits first or the
        time runs out (the server is left running: the caller stops it).
        """
        import httpx

        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if (why := self.failure()) is not None:
                self._drain()
                cause = self.first_error()
                raise ServerError(
                    f"server did not start: {why}"
                    + (f" ({cause})" if cause else "")
                    + f"; log {self.log_path}, last lines:\n{self.log_tail()}"
                )
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    return time.monotonic() - started
            time.sleep(0.5)
        raise ServerError(
            f"server not healthy at {url} after {timeout_s:g} s; last log lines:\n{self.log_tail()}"
        )

    def _drain(self, timeout_s: float = 5.0) -> None:
        """Let the reader thread copy what the process printed last."""
        if self._reader is not None:
            self._reader.join(timeout_s)

    def pause(self) -> None:
        """SIGSTOP the process group: a server up and waiting its turn takes no CPU at all (an
        idle vLLM server on CPU takes about 1.6% of a core; ``benchmarks/truth/idle_server.py``)."""
        if self.process is not None and self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT the process group (after :meth:`pause`; harmless otherwise)."""
        if self.process is not None:
            _signal_group(self.process.pid, signal.SIGCONT)

    def stop(self) -> None:
        """SIGTERM the process group (and SIGCONT it, in case it was paused), SIGKILL it after
        :data:`STOP_GRACE_S`; idempotent."""
        proc = self.process
        if proc is None:
            return
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            _signal_group(proc.pid, signal.SIGCONT)
            try:
                proc.wait(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=STOP_GRACE_S)
        # children the leader left behind (an engine core that outlived its API server)
        _signal_group(proc.pid, signal.SIGKILL)
        self._drain()


def start_on_loopback(
    command: Callable[[int], Sequence[str]],
    log_path: Path,
    env: Mapping[str, str] | None,
    hook: LineHook | None,
    timeout_s: float,
    port: int | None = None,
    started: Callable[[ManagedServer, int], None] | None = None,
) -> float:
    """Start ``command(port)`` and wait for its ``/health`` on 127.0.0.1; returns the seconds it
    took to come up. ``started`` is told each server and its port as it starts.

    With no ``port`` given, one is picked here (:func:`free_loopback_port`); it is free when
    picked, not when the server binds it seconds later, and any process may take it in between
    (another server's engine picking its own ports: a slow-tier run lost a fleet's server so).
    A server that exits on ``Address already in use`` is then started again on another port,
    :data:`PORT_ATTEMPTS` in all, said, its log kept beside as ``<log>.attempt-<n>``. A port the
    caller chose is the caller's: a clash there is an error at once. Raises :class:`ServerError`
    (the server left running for the caller to stop, as :meth:`ManagedServer.wait_healthy`).
    """
    for attempt in range(1, PORT_ATTEMPTS + 1):
        chosen = port or free_loopback_port()
        server = ManagedServer(command(chosen), log_path, env, hook)
        server.start()
        if started is not None:
            started(server, chosen)
        try:
            return server.wait_healthy(f"http://127.0.0.1:{chosen}/health", timeout_s)
        except ServerError:
            if port or attempt == PORT_ATTEMPTS or not server.lost_its_port():
                raise
        server.stop()
        kept = log_path.with_name(f"{log_path.name}.attempt-{attempt}")
        log_path.replace(kept)
        console.print(
            f"[yellow]warning:[/] port {chosen} was taken before the server bound it (another "
            f"process took it after it was picked); starting it again on another port (its log "
            f"kept as {escape(str(kept))})",
            soft_wrap=True,
        )
    raise AssertionError("unreachable")  # the last attempt returns or raises


def renice_tree(pid: int, nice: int) -> int:
    """Set every thread of process ``pid`` and of its descendants to ``nice`` (per thread: on
    Linux a nice value is a thread's); returns how many threads took it."""
    import psutil

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0
    done = 0
    for process in processes:
        with contextlib.suppress(psutil.Error, OSError):
            for thread in process.threads():
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, thread.id, nice)
                    done += 1
    return done


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class LogFollower:
    """Lines another process appends to a log file, each handed to ``hook`` with the
    ``perf_counter`` it was read at (within :data:`FOLLOW_POLL_S` of being written).

    For a server started elsewhere (``backend.server.log_file``): reading starts at the file's
    end, so only what the server logs from now on is seen.
    """

    def __init__(self, path: Path, hook: LineHook) -> None:
        self.path = path
        self.hook = GuardedHook(hook)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        handle = self.path.open("rb")
        handle.seek(0, os.SEEK_END)
        self._thread = threading.Thread(
            target=self._follow, args=(handle,), name="log-follower", daemon=True
        )
        self._thread.start()

    def _follow(self, handle: Any) -> None:
        partial = b""
        with handle:
            while True:
                chunk = handle.readline()
                if chunk:
                    partial += chunk
                    if partial.endswith(b"\n"):
                        now = time.perf_counter()
                        self.hook(partial.decode(errors="replace").rstrip("\r\n"), now)
                        partial = b""
                    continue
                if self._stop.is_set():
                    return
                time.sleep(FOLLOW_POLL_S)

    def stop(self) -> None:
        """Read what is there now, then stop."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
