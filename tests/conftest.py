"""Shared fixtures: paths, Hydra composition against the project's configs, the gpu marker."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

from gpu_simulate_test.cli.registry import CONFIG_DIR, register_configs

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


def run_cli(
    stage: str, *overrides: str, cwd: Path, check: bool = True
) -> subprocess.CompletedProcess:
    """Run ``python -m gpu_simulate_test.cli.<stage>`` as a user would, in ``cwd``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    proc = subprocess.run(
        [sys.executable, "-m", f"gpu_simulate_test.cli.{stage}", *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{stage} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc
