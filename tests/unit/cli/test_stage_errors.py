"""How a stage's entry point reports a failure caused by its input: one line and exit code 2;
an error another library raised on a value no check of ours caught says where it surfaced."""

from __future__ import annotations

import errno
import signal
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
from omegaconf import OmegaConf

from gpu_simulate_test.cli._common import run_stage
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.simulator.registry import EngineRegistry


@dataclass(frozen=True)
class Tiny:
    n: int = 0


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


def test_hangup_and_terminate_unwind_as_ctrl_c_and_an_ignored_ctrl_c_is_heard() -> None:
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # started in the background by a script
        run_stage(OmegaConf.structured(Tiny), Tiny, lambda _c, _r: Path())
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        for sig in (signal.SIGTERM, signal.SIGHUP):
            handler = signal.getsignal(sig)
            assert callable(handler)
            with pytest.raises(KeyboardInterrupt, match=f"^by {sig.name}$"):
                handler(sig, None)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # under nohup: it stays ignored
        run_stage(OmegaConf.structured(Tiny), Tiny, lambda _c, _r: Path())
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
