"""How a stage's entry point reports a failure caused by its input: one line and exit code 2;
an error another library raised on a value no check of ours caught says where it surfaced."""

from __future__ import annotations

import errno
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf

from gpu_simulate_test.cli import _common
from gpu_simulate_test.cli._common import run_stage
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.simulator.registry import EngineRegistry


@dataclass(frozen=True)
class Tiny:
    n: int = 0


STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture(autouse=True)
def _handlers_put_back() -> Iterator[None]:
    """run_stage installs the stages' handlers: each test's are put back after it."""
    saved = {s: signal.getsignal(s) for s in STOPPING}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


def _exit(body: Any, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as code:
        run_stage(OmegaConf.structured(Tiny), Tiny, body)
    return int(str(code.value.code)), " ".join(capsys.readouterr().out.split())


def test_a_library_error_no_check_caught_says_where_it_surfaced(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def body(_cfg: Tiny, _resolved: dict[str, Any]) -> Path:
        return Path(str(np.max(np.array([]))))  # numpy's "zero-size array to reduction ..."

    code, out = _exit(body, capsys)
    assert code == 2 and out.startswith("error: zero-size array")
    assert "no input check of this toolkit caught it: ValueError from " in out
    assert "gpu_simulate_test/cli/_common.py:" in out  # the last of the package's frames
    assert "please report it" in out


def test_our_own_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def ours(_cfg: Tiny, _resolved: dict[str, Any]) -> Path:
        raise ArtifactError("x.csv: row 2, column 'a': expected a number")

    def checked(_cfg: Tiny, _resolved: dict[str, Any]) -> Path:
        EngineRegistry(MappingProxyType({})).get("nope")  # a ValueError the package raises
        return Path()

    for body in (ours, checked):
        code, out = _exit(body, capsys)
        assert code == 2 and out.startswith("error: ") and "report" not in out


def test_a_place_it_cannot_write_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def read_only(_cfg: Tiny, _resolved: dict[str, Any]) -> Path:
        raise OSError(errno.EROFS, "Read-only file system", "out/workload")

    code, out = _exit(read_only, capsys)
    assert code == 1 and out == "error: [Errno 30] Read-only file system: 'out/workload'"

    def refused(_cfg: Tiny, _resolved: dict[str, Any]) -> Path:
        raise ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")

    with pytest.raises(ConnectionRefusedError):  # not a place to write: its traceback, as ever
        run_stage(OmegaConf.structured(Tiny), Tiny, refused)


def test_hangup_and_terminate_unwind_as_ctrl_c_and_an_ignored_ctrl_c_is_heard(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    left: list[bool] = []
    monkeypatch.setattr(_common, "_leave_terminal", lambda: left.append(True))  # this terminal
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # started in the background by a script
    signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as from a terminal (not under nohup)
    run_stage(OmegaConf.structured(Tiny), Tiny, lambda _c, _r: Path())
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    for sig in (signal.SIGTERM, signal.SIGHUP):
        handler = signal.getsignal(sig)
        assert callable(handler)
        with pytest.raises(KeyboardInterrupt, match=f"^by {sig.name}$"):
            handler(sig, None)
    assert left == [True]  # a hangup leaves the terminal; SIGTERM does not
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # under nohup: it stays ignored
    run_stage(OmegaConf.structured(Tiny), Tiny, lambda _c, _r: Path())
    assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN


def test_leaving_the_terminal_keeps_pipes_and_files(tmp_path: Path) -> None:
    """Run in a child whose stdout is a file and stderr a pipe: both keep their output."""
    import subprocess
    import sys

    code = (
        "from gpu_simulate_test.cli._common import _leave_terminal\n"
        "_leave_terminal(); print('kept', flush=True)\n"
        "import sys; print('kept too', file=sys.stderr, flush=True)\n"
    )
    out = tmp_path / "out.txt"
    with out.open("w") as handle:
        proc = subprocess.run([sys.executable, "-c", code], stdout=handle, stderr=subprocess.PIPE,
                              text=True, check=True)  # fmt: skip
    assert out.read_text() == "kept\n" and proc.stderr == "kept too\n"


def test_leaving_the_terminal_sends_a_terminals_output_to_the_null_device() -> None:
    import os
    import subprocess
    import sys

    code = (
        "from gpu_simulate_test.cli._common import _leave_terminal\n"
        "print('before', flush=True); _leave_terminal(); print('after', flush=True)\n"
    )
    master, slave = os.openpty()
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=slave, stderr=subprocess.DEVNULL)
    os.close(slave)
    seen = b""
    while True:
        try:
            chunk = os.read(master, 1024)
        except OSError:  # the terminal's other end closed
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert proc.wait(timeout=60) == 0
    assert b"before" in seen and b"after" not in seen
