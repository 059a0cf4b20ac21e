"""The package's shape: the library imports no Hydra, every experiment config composes into the
stage it is written for, and the configs ship inside the package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpu_simulate_test.config.registry import CONFIG_DIR, STAGE_SCHEMAS, to_typed

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))


def test_the_library_imports_no_hydra() -> None:
    # every module but the CLI layer, imported in a fresh interpreter
    code = """
import importlib, pkgutil, sys
import gpu_simulate_test
names = [m.name for m in pkgutil.walk_packages(gpu_simulate_test.__path__, "gpu_simulate_test.")
         if not m.name.startswith("gpu_simulate_test.cli")]
for name in names:
    importlib.import_module(name)
print(len(names), sorted(m for m in sys.modules if m.split(".")[0] == "hydra"))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    count, hydra = proc.stdout.strip().split(" ", 1)
    assert int(count) > 50
    assert hydra == "[]"


def test_configs_ship_inside_the_package() -> None:
    assert CONFIG_DIR == REPO / "src" / "gpu_simulate_test" / "configs"
    assert {p.stem for p in CONFIG_DIR.glob("*.yaml")} >= set(STAGE_SCHEMAS)
    assert not (REPO / "configs").exists()  # one copy: the one the wheel carries


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_config_composes(compose_stage: Any, experiment: str) -> None:
    """Each experiment into the stage it is written for (``fidelity_*``: the fidelity stage;
    the others: the pipeline), validated against that stage's schema."""
    stage = "fidelity" if experiment.startswith("fidelity_") else "pipeline"
    cfg: Any = to_typed(compose_stage(stage, [f"+experiment={experiment}"]), STAGE_SCHEMAS[stage])
    assert cfg.stage.run_type == stage
    assert cfg.model.name and cfg.hardware.name
    if stage == "fidelity":
        assert cfg.fidelity.num_requests >= 2
