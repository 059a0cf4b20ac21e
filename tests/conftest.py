"""Shared fixtures: paths, Hydra composition against the project's configs, the gpu marker."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import to_typed

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # as .ci/run: no hub at run time, in or out of process

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_FIXTURES = REPO_ROOT / "tests" / "data" / "fixtures"
"""Real tool outputs and a real trace, carried in the repository (README there: provenance)."""
SPLITWISE_TRACE = SHARED_FIXTURES / "traces" / "splitwise_conv.csv"


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


def vllm_stage_config(
    compose_stage: Callable[..., DictConfig], *overrides: str
) -> RealBenchStageConfig:
    """real_bench's typed config with ``backend=vllm`` and ``overrides`` (no workload read)."""
    return to_typed(
        compose_stage("real_bench", ["backend=vllm", "workload_dir=w", *overrides]),
        RealBenchStageConfig,
    )


@pytest.fixture
def compose_stage() -> Iterator:
    """``compose_stage(name, overrides)`` composes ``configs/<name>.yaml`` like the CLI does."""
    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):

        def _compose(name: str, overrides: Sequence[str] = ()) -> DictConfig:
            return compose(config_name=name, overrides=list(overrides))

        yield _compose
    GlobalHydra.instance().clear()


_IN_PROCESS = {"default": True}
"""Whether :func:`run_cli` runs a stage in this process; set per test by :func:`_stage_process`."""


@pytest.fixture(autouse=True)
def _stage_process(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fast tests run stages in this process; slow ones (real engines, signals, servers the
    stage starts and must stop) keep a process of their own, as a user's shell gives them.
    Module fixtures (set up between tests) run them in this process."""
    _IN_PROCESS["default"] = "slow" not in request.node.keywords
    yield
    _IN_PROCESS["default"] = True


def run_cli(
    stage: str,
    *overrides: str,
    cwd: Path,
    check: bool = True,
    subprocess_: bool | None = None,
    timeout_s: float = 600,
) -> subprocess.CompletedProcess:
    """Run ``python -m gpu_simulate_test.cli.<stage>`` as a user would, in ``cwd`` (a process of
    its own is stopped after ``timeout_s``).

    In this process for fast tests (:func:`run_cli_in_process`: the same Hydra app, arguments,
    exit code and output, without a fresh interpreter's imports), in a process of its own for
    slow ones; ``subprocess_`` overrides that, for a test of what only a process shows.
    """
    if subprocess_ is None:
        subprocess_ = not _IN_PROCESS["default"]
    if not subprocess_:
        return run_cli_in_process(stage, *overrides, cwd=cwd, check=check)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    proc = subprocess.run(
        [sys.executable, "-m", f"gpu_simulate_test.cli.{stage}", *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{stage} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def run_cli_in_process(
    stage: str, *overrides: str, cwd: Path, check: bool = True
) -> subprocess.CompletedProcess:
    """The stage's Hydra app called in this process with ``sys.argv`` and the working directory
    set as a user's shell would, its output captured and its ``SystemExit`` read as the exit code
    (an uncaught exception is exit code 1 with its traceback on stderr, as Python prints it).
    Whatever it changes process-wide (the directory, ``sys.argv``, Hydra's global state, the
    signal handlers, the root logger's handlers, the console's width) is put back afterwards."""
    import contextlib
    import importlib
    import io
    import logging
    import signal
    import traceback

    from gpu_simulate_test.core.reporting import console

    app = importlib.import_module(f"gpu_simulate_test.cli.{stage}")
    out, err = io.StringIO(), io.StringIO()
    root = logging.getLogger()
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    saved = (sys.argv, Path.cwd(), [signal.getsignal(s) for s in signals], console.width)
    saved_logging = (list(root.handlers), root.level)
    code: int = 0
    GlobalHydra.instance().clear()
    try:
        os.chdir(cwd)
        sys.argv = [f"{app.__name__}", *overrides]
        console.width = 120
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                app.main()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
            except Exception:  # what the interpreter does with an uncaught one: exit code 1
                traceback.print_exc()
                code = 1
    finally:
        sys.argv, cwd_before, handlers, width = saved
        os.chdir(cwd_before)
        for signum, handler in zip(signals, handlers, strict=True):
            if handler is not None:  # None: set outside Python, left as it is
                signal.signal(signum, handler)
        console.width = width
        root.handlers[:], level = saved_logging  # Hydra's job logging wrote to the capture
        root.setLevel(level)
        GlobalHydra.instance().clear()
    proc = subprocess.CompletedProcess(
        [sys.executable, "-m", app.__name__, *overrides], code, out.getvalue(), err.getvalue()
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{stage} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc
