"""Run directories: create one safely, record its metadata, mark it complete, failed or interrupted.

A run directory holds :data:`~gpu_simulate_test.io.layout.INCOMPLETE_MARKER` from the moment it is
created until the stage finishes; ``run_meta.json`` says ``status: running`` until then, and
``complete``, ``failed`` or ``interrupted`` after. Readers (:func:`open_upstream_run`) refuse runs
that are not complete.
"""

from __future__ import annotations

import contextlib
import os
import platform
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

from gpu_simulate_test import __version__
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, read_json, write_json

RUN_META_SCHEMA_VERSION = "1.0"
TRACKED_PACKAGES: tuple[str, ...] = (
    "gpu-simulate-test",
    "torch",
    "transformers",
    "vidur",
    "hydra-core",
    "omegaconf",
    "numpy",
    "pandas",
    "nvidia-ml-py",
)


class RunExistsError(FileExistsError):
    """A run with this id exists already and overwriting was not allowed."""


def utc_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str | None]:
    """Installed versions of the packages that change results (None when not installed)."""
    versions: dict[str, str | None] = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def git_commit(cwd: Path | None = None) -> dict[str, Any]:
    """The project's git commit and whether the work tree had changes (None outside a checkout)."""
    where = cwd or Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": sha, "dirty": bool(dirty)}


def cpu_name() -> str:
    """The CPU model name from /proc/cpuinfo, or platform.processor() elsewhere."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def gpu_info() -> list[dict[str, Any]]:
    """Name, driver, memory and clocks of each NVIDIA GPU through NVML; empty without one."""
    try:
        import pynvml
    except ImportError:
        return []
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: no NVIDIA GPU here
        return []
    gpus: list[dict[str, Any]] = []
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            gpus.append(
                {
                    "index": index,
                    "name": pynvml.nvmlDeviceGetName(handle),
                    "driver": driver,
                    "memory_total_bytes": int(mem.total),
                    "max_sm_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(
                        handle, pynvml.NVML_CLOCK_SM
                    ),
                    "max_mem_clock_mhz": pynvml.nvmlDeviceGetMaxClockInfo(
                        handle, pynvml.NVML_CLOCK_MEM
                    ),
                }
            )
    finally:
        pynvml.nvmlShutdown()
    return gpus


def host_info() -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu": cpu_name(),
        "gpus": gpu_info(),
    }


@dataclass
class Run:
    """A run being written: its directory and the metadata that goes into ``run_meta.json``."""

    path: Path
    stage: str
    run_id: str
    meta: dict[str, Any] = field(default_factory=dict)

    def file(self, name: str) -> Path:
        return self.path / name

    def update_meta(self, **values: Any) -> None:
        """Add stage-specific fields to ``run_meta.json`` (written immediately, atomically)."""
        self.meta.update(values)
        write_json(self.path / layout.RUN_META, self.meta)


@contextlib.contextmanager
def start_run(
    root: Path | str,
    stage: str,
    run_id: str,
    config: Mapping[str, Any],
    overwrite: bool = False,
    inputs: Sequence[Path | str] = (),
) -> Iterator[Run]:
    """Create ``<root>/<stage>/<run_id>`` and yield a :class:`Run`; finalise its status on exit.

    An existing run is never replaced unless ``overwrite`` is true, and never when it holds one
    of the run's ``inputs`` (a run read as it is replaced). If the body raises, the run is marked
    ``failed`` (``interrupted`` on Ctrl-C) and keeps its incomplete marker.
    """
    path = layout.run_dir(root, stage, run_id)
    if path.exists():
        if not overwrite:
            raise RunExistsError(
                f"{path} already exists; choose another output.run_id or pass output.overwrite=true"
            )
        held = [p for p in inputs if Path(p).resolve().is_relative_to(path.resolve())]
        if held:
            raise RunExistsError(
                f"{path} holds this run's own input {held[0]}: output.overwrite=true would delete "
                "it before it is read; choose another output.run_id"
            )
    # the probes (git, packages, host) first: a run stopped during them leaves no directory
    meta = {
        "schema_version": RUN_META_SCHEMA_VERSION,
        "stage": stage,
        "run_id": run_id,
        "status": "running",
        "config": dict(config),
        "git": git_commit(),
        "packages": package_versions(),
        "toolkit_version": __version__,
        "host": host_info(),
        "start_time": utc_now(),
        "end_time": None,
        "error": None,
    }
    if path.exists():
        retire_run(path)
    path.mkdir(parents=True)
    (path / layout.INCOMPLETE_MARKER).write_text("this run has not finished\n")
    started = time.time()
    run = Run(path=path, stage=stage, run_id=run_id, meta=meta)
    write_json(path / layout.RUN_META, run.meta)
    try:
        yield run
    except KeyboardInterrupt as exc:
        how = str(exc) if str(exc).startswith("by SIG") else "by the user (Ctrl-C)"
        _finish(run, "interrupted", started, f"interrupted {how}")
        raise
    except BaseException as exc:
        _finish(run, "failed", started, f"{type(exc).__name__}: {exc}")
        raise
    _finish(run, "complete", started, None)


STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Held back while a run's final status is written, so that a second Ctrl-C cannot leave it
``running``; delivered once it is written."""


def retire_run(path: Path) -> None:
    """Delete the run at ``path`` (being replaced), moved aside first: a run interrupted while
    it is deleted never looks complete."""
    aside = path.with_name(f".{path.name}.replaced-{secrets.token_hex(3)}")
    os.replace(path, aside)
    shutil.rmtree(aside)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold back the stopping signals (their Python handlers swapped for one that notes them,
    whichever thread the kernel hands them to) and deliver each noted one afterwards, to the
    handler it had. Off the main thread, where handlers cannot be set, nothing is held."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    saved = {s: signal.getsignal(s) for s in STOPPING_SIGNALS}
    held = [s for s, h in saved.items() if h not in (signal.SIG_IGN, None)]
    for s in held:
        signal.signal(s, lambda signum, _frame: noted.append(signum))
    try:
        yield
    finally:
        for s in held:
            signal.signal(s, saved[s])
        for signum in dict.fromkeys(noted):
            signal.raise_signal(signum)


def _finish(run: Run, status: str, started: float, error: str | None) -> None:
    """Write the final status (and, for a complete run, drop the marker) with the stopping
    signals held back; a failed run whose status cannot be written (a full disk) keeps
    ``running`` and its marker, and the error that failed it goes on."""
    with signals_held():
        run.meta.update(
            status=status,
            end_time=utc_now(),
            wall_time_s=round(time.time() - started, 3),
            error=error,
        )
        try:
            write_json(run.path / layout.RUN_META, run.meta)
        except OSError:
            if status == "complete":
                raise
            return
        if status == "complete":
            (run.path / layout.INCOMPLETE_MARKER).unlink()


def open_upstream_run(path: Path | str, stage: str) -> dict[str, Any]:
    """Check that ``path`` is a complete run of ``stage`` and return its ``run_meta.json``."""
    p = Path(path)
    if not p.is_dir():
        raise ArtifactError(f"{p}: run directory does not exist (expected a {stage} run)")
    meta = read_json(p / layout.RUN_META, required_keys=("stage", "status"))
    if meta["stage"] != stage:
        raise ArtifactError(f"{p}: is a {meta['stage']} run, expected a {stage} run")
    version = str(meta.get("schema_version", RUN_META_SCHEMA_VERSION))
    if version.split(".")[0] != RUN_META_SCHEMA_VERSION.split(".")[0]:
        raise ArtifactError(
            f"{p / layout.RUN_META}: field 'schema_version' is {version!r}, expected "
            f"{RUN_META_SCHEMA_VERSION} (version {meta.get('toolkit_version') or 'unknown'} of "
            "this toolkit wrote it; read it with that version, or run that stage again)"
        )
    if meta["status"] != "complete":
        raise ArtifactError(
            f"{p}: run is not complete (status={meta['status']}); "
            f"error: {meta.get('error') or 'none recorded'}"
        )
    marker = p / layout.INCOMPLETE_MARKER
    if marker.exists():
        raise ArtifactError(
            f"{p}: {layout.RUN_META} says complete, but the marker {marker} is still there: the "
            "run was interrupted while finishing, or is still being written; rerun that stage "
            "(or wait for it to finish)"
        )
    return meta


def default_run_id(config: Mapping[str, Any]) -> str:
    """``<UTC time>-<config id>-<random>``: sorts by launch time, says which config it ran, and
    is unique per call (the random part tells apart launches of one config in the same second).

    Call it once per launch and hand the id to every stage of that launch (as the pipeline does).
    """
    from gpu_simulate_test.io.artifacts import stable_id

    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{stable_id(dict(config), length=8)}-{secrets.token_hex(3)}"


def multirun_jobs(root: Path | str, stage: str, run_id: str, since: datetime) -> list[Path]:
    """Complete runs ``<root>/<stage>/<run_id>-<job number>`` (a Hydra multirun's jobs) started
    at ``since`` or later (so runs of an earlier multirun with the same id are left out), by job
    number."""
    since = since.replace(microsecond=since.microsecond // 1000 * 1000)  # run_meta keeps ms
    found: list[tuple[int, Path]] = []
    for path in Path(root, stage).glob(f"{run_id}-*"):
        number = path.name.removeprefix(f"{run_id}-")
        if not number.isdigit() or not (path / layout.RUN_META).is_file():
            continue
        try:
            meta = read_json(path / layout.RUN_META, required_keys=("status", "start_time"))
        except ArtifactError:
            continue
        if meta["status"] == "complete" and datetime.fromisoformat(meta["start_time"]) >= since:
            found.append((int(number), path))
    return [path for _, path in sorted(found)]
