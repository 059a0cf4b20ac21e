"""What every stage entry point does around its library call: typing, run ids, error reporting."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import sys
import threading
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from rich.markup import escape

from gpu_simulate_test.config.registry import to_resolved, to_typed
from gpu_simulate_test.config.schema import ConfigError, OutputConfig
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.io.runs import RunExistsError

T = TypeVar("T")
PACKAGE_DIR = Path(__file__).resolve().parents[1]
"""This package's folder: a traceback's frames in it are the toolkit's own."""

USER_ERRORS = (ConfigError, ArtifactError, RunExistsError, FileNotFoundError, ValueError)
"""Failures caused by the input: shown as one clear line, not a traceback."""
WRITE_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT)
"""A place the stage cannot write (full, read-only, not the user's): one line, exit code 1."""


def print_error(label: str, exc: BaseException) -> None:
    """``<label>: <exc>`` in red, on one line however long (a path and its detail), with any
    brackets in the message shown as they are (not read as rich markup)."""
    console.print(f"[bold red]{label}:[/] {escape(str(exc))}", soft_wrap=True)


def _unchecked_origin(exc: BaseException) -> str | None:
    """For an error raised inside another library (numpy, pandas, Vidur) on a value no input
    check of this toolkit caught, where it surfaced from the toolkit, for a report; None for one
    the toolkit raised itself (its message names the file and field, or the knob)."""
    if isinstance(exc, ConfigError | ArtifactError | RunExistsError):
        return None
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [(f, where) for f in frames if (where := _package_path(f.filename))]
    if not ours or ours[-1][0] is frames[-1]:
        return None
    last, where = ours[-1]
    return (
        f"  (no input check of this toolkit caught it: {type(exc).__name__} from "
        f"{where}:{last.lineno} in {last.name}; please report it with the command)"
    )


def _package_path(filename: str) -> str | None:
    """``gpu_simulate_test/...`` for a file of this package, else None."""
    path = Path(filename).resolve()
    if not path.is_relative_to(PACKAGE_DIR):
        return None
    return "/".join((PACKAGE_DIR.name, *path.relative_to(PACKAGE_DIR).parts))


def _multirun_suffix(cfg: DictConfig) -> DictConfig:
    """In a multirun, give each job its own run id (``<run_id>-<job number>``)."""
    if not HydraConfig.initialized():
        return cfg
    hydra_cfg = HydraConfig.get()
    run_id = OmegaConf.select(cfg, "output.run_id")
    if hydra_cfg.mode == RunMode.MULTIRUN and run_id:
        cfg = cfg.copy()
        OmegaConf.update(cfg, "output.run_id", f"{run_id}-{hydra_cfg.job.num}", merge=False)
    return cfg


def _terminated(signum: int, _frame: Any) -> None:
    """SIGTERM (``kill``, a job scheduler) and SIGHUP (the terminal closed, ssh dropped) unwind
    like Ctrl-C: the run is marked interrupted and a server the stage started is stopped,
    instead of the process vanishing mid-write."""
    if signum == signal.SIGHUP:
        _leave_terminal()
    raise KeyboardInterrupt(f"by {signal.Signals(signum).name}")


def _leave_terminal() -> None:
    """After a hangup, output to the terminal that is gone fails (EIO) and would turn the
    interruption into a failure: the standard streams that are terminals write to the null
    device instead (pipes and files keep theirs)."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                if stat.S_ISCHR(os.fstat(fd).st_mode):
                    os.dup2(null, fd)
    finally:
        os.close(null)


def _handle_signals() -> None:
    """SIGTERM and SIGHUP as :func:`_terminated` (SIGHUP left ignored under ``nohup``); SIGINT
    as Ctrl-C even where the stage was started in the background with it ignored (a script's
    time limit sends one)."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGTERM, _terminated)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # nohup's choice is kept
        signal.signal(signal.SIGHUP, _terminated)
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_stage(cfg: DictConfig, schema: type[T], body: Callable[[T, dict[str, Any]], Path]) -> Path:
    """Validate ``cfg`` against ``schema``, run ``body`` and turn input errors into exit code 2."""
    cfg = _multirun_suffix(cfg)
    _handle_signals()
    try:
        typed = to_typed(cfg, schema)
        return body(typed, to_resolved(cfg, typed))
    except USER_ERRORS as exc:
        print_error("error", exc)
        unchecked = _unchecked_origin(exc)
        if unchecked:
            console.print(unchecked, soft_wrap=True, markup=False)
        sys.exit(2)
    except OSError as exc:
        if exc.errno not in WRITE_ERRNOS:
            raise
        print_error("error", exc)  # the output root read-only, the disk full: not a traceback
        sys.exit(1)
    except KeyboardInterrupt:
        # the run directory (if one was started) is already marked interrupted, with what was
        # measured so far; a traceback would only hide that
        console.print(
            "[bold red]interrupted[/] (Ctrl-C, SIGTERM or SIGHUP); a run already started is "
            "marked interrupted, with what it had written"
        )
        sys.exit(130)


class MultirunReportCallback(Callback):
    """After a Hydra multirun, one report over its jobs (a subclass says which: its ``what``,
    :meth:`check` before any job runs, :meth:`write` after the last, and the ``missing`` line).

    Hydra turns a callback's exception into a warning and exits 0, so failures here print one
    error line and exit the process themselves (``SystemExit`` is not caught): 2 for an input
    error (the report directory exists, ...), 1 for anything else.
    """

    what = "report"
    missing = ""
    """Printed when :meth:`write` made no report (no run id, too few jobs)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self.started = datetime.now(UTC)

    def check(self, output: OutputConfig) -> None:
        """Refuse before any job runs (e.g. the report's directory exists)."""

    def write(self, config: DictConfig, output: OutputConfig, progress: bool) -> Path | None:
        raise NotImplementedError

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = datetime.now(UTC)
        if not self.enabled:
            return
        try:
            self.check(multirun_output(config))
        except USER_ERRORS as exc:  # before any job has run
            print_error("error", exc)
            sys.exit(2)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.enabled:
            return
        progress = bool(config.get("progress", True))
        try:
            path = self.write(config, multirun_output(config), progress)
        except USER_ERRORS as exc:
            print_error(f"{self.what} failed", exc)
            sys.exit(2)
        except Exception:
            traceback.print_exc()
            console.print(f"[bold red]{self.what} failed[/] (traceback above)")
            sys.exit(1)
        if path is None and progress:
            console.print(self.missing)


def multirun_output(config: DictConfig) -> OutputConfig:
    """The multirun's ``output`` node, typed (its run id names the report)."""
    out = config.output
    run_id = None if out.run_id is None else str(out.run_id)
    shared = out.get("shared_root")
    return OutputConfig(
        root=str(out.root),
        run_id=run_id,
        overwrite=bool(out.overwrite),
        shared_root=None if shared is None else str(shared),
    )
