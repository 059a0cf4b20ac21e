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


STAGES = {
    "workload", "vidur_profile", "vidur_simulate", "real_bench", "compare", "deep_profile",
    "fidelity", "pipeline", "capacity",
}  # fmt: skip
ORCHESTRATORS = {"pipeline", "fidelity", "capacity"}
"""They call the other stages' ``run()``."""
FLOORS = {"io": {"io"}, "config": {"config", "io"}, "core": {"core", "config", "io"}}
"""What each shared layer may import."""


def layering_violations(top: str, source: str) -> list[str]:
    """The project imports in ``source`` (a module of the folder ``top``) that break the rules:
    a shared layer reaching above itself, or a stage importing another stage's code (its
    ``contract`` module is allowed; the orchestrators may import any stage)."""
    import ast

    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpu_simulate_test"):
            assert node.module is not None
            named = [f"{node.module}.{a.name}" for a in node.names]
            contracts = [m for m in named if m.endswith(".contract")]
            modules = contracts or [node.module]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names if a.name.startswith("gpu_simulate_test")]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            target = parts[1] if len(parts) > 1 else ""
            if not target or target == top:
                continue
            if (top in FLOORS and target not in FLOORS[top]) or (
                top in STAGES - ORCHESTRATORS
                and target in STAGES
                and not module.endswith(".contract")
            ):
                bad.append(module)
    return bad


def test_layering_checker_catches_what_it_should() -> None:
    assert layering_violations("compare", "from gpu_simulate_test.real_bench.stage import run")
    assert layering_violations("compare", "import gpu_simulate_test.vidur_simulate.plan")
    assert layering_violations("core", "from gpu_simulate_test.compare import contract")
    assert layering_violations("io", "from gpu_simulate_test.config.schema import X")
    assert not layering_violations("compare", "from gpu_simulate_test.real_bench import contract")
    assert not layering_violations("compare", "from gpu_simulate_test.core.knobs import x")
    assert not layering_violations("pipeline", "from gpu_simulate_test.compare.stage import run")


def test_no_stage_imports_another_stage_and_io_imports_nothing_above_it() -> None:
    package = REPO / "src" / "gpu_simulate_test"
    found = {}
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        top = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        bad = layering_violations(top, path.read_text())
        if bad:
            found[str(rel)] = bad
    assert not found


def test_every_stage_has_a_stage_and_a_contract_module() -> None:
    package = REPO / "src" / "gpu_simulate_test"
    for stage in sorted(STAGES):
        assert (package / stage / "stage.py").is_file(), stage
        assert (package / stage / "contract.py").is_file(), stage
