"""The package's shape: the library imports no Hydra, every experiment config composes into the
stage it is written for, and the configs ship inside the package."""

from __future__ import annotations

import ast
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


EXPERIMENT_STAGES = {
    "fidelity_": "fidelity",
    "capacity_": "capacity",
    "profile_": "vidur_profile",
    "tune_": "tune",
}
"""An experiment's stage by its name's prefix; the others are the pipeline's."""


def stage_of(experiment: str) -> str:
    """The stage an experiment config is written for."""
    prefix = next((p for p in EXPERIMENT_STAGES if experiment.startswith(p)), None)
    return EXPERIMENT_STAGES[prefix] if prefix else "pipeline"


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_every_experiment_config_composes(compose_stage: Any, experiment: str) -> None:
    """Each experiment into the stage it is written for (:func:`stage_of`: ``fidelity_*``,
    ``capacity_*``, ``profile_*`` (vidur_profile); the others: the pipeline), validated against
    that stage's schema."""
    stage = stage_of(experiment)
    typed: object = to_typed(
        compose_stage(stage, [f"+experiment={experiment}"]), STAGE_SCHEMAS[stage]
    )
    assert isinstance(typed, STAGE_SCHEMAS[stage])
    cfg: Any = typed
    assert cfg.model.name and cfg.hardware.name
    if stage == "fidelity":
        assert cfg.fidelity.num_requests >= 2
    if stage == "vidur_profile":
        assert cfg.engine.enable  # a preset's bundle carries the engine calibration


STAGES = {
    "workload", "vidur_profile", "vidur_simulate", "real_bench", "compare", "deep_profile",
    "fidelity", "pipeline", "capacity", "bench_import", "tune",
}  # fmt: skip
ORCHESTRATORS = {"pipeline", "fidelity", "capacity", "tune"}
"""They call the other stages' ``run()``."""
BUILDS_ON = {"tune": {"capacity"}}
"""An orchestrator whose work is another's, repeated: the tune is the capacity search per
configuration (its simulated rate, its bracket and real search, its bundle and workload), so it
imports the capacity stage's code rather than a copy of it."""
SHARED_STEPS = "orchestrate"
"""The steps every orchestrator calls (serve, run the truth, simulate, compare): not a stage."""
FLOORS = {
    "io": {"io"},
    "config": {"config", "io"},
    "core": {"core", "config", "io"},
    "calibration": {"calibration", "core", "config", "io"},
    "simulator": {"simulator", "calibration", "core", "config", "io"},
}
"""What each shared layer may import (the engine calibration sits on core: stages read it; the
simulator library on the calibration, whose fits its step model reads)."""
PACKAGE = REPO / "src" / "gpu_simulate_test"


def imported_modules(source: str) -> list[str]:
    """The project modules ``source`` imports, one per imported name: ``from a.b import c``
    imports the module ``a.b.c`` when ``c`` is a submodule of ``a.b``, else ``a.b`` itself (``c``
    is a symbol of that module or of the package's ``__init__``)."""

    def is_module(dotted: str) -> bool:
        path = PACKAGE.parent.joinpath(*dotted.split("."))
        return path.with_suffix(".py").is_file() or path.is_dir()

    modules = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gpu_simulate_test"):
            assert node.module is not None
            named = [f"{node.module}.{a.name}" for a in node.names]
            modules += [m if is_module(m) else node.module for m in named]
        elif isinstance(node, ast.Import):
            modules += [a.name for a in node.names if a.name.startswith("gpu_simulate_test")]
    return modules


def layering_violations(top: str, source: str) -> list[str]:
    """The project imports in ``source`` (a module of the folder ``top``) that break the rules:
    a shared layer reaching above itself; a stage importing another stage's code (its
    ``contract`` module is allowed) or the shared steps; an orchestrator or the shared steps
    importing an orchestrator's code (its ``contract`` is allowed; any other stage is)."""
    bad = []
    for module in imported_modules(source):
        parts = module.split(".")
        target = parts[1] if len(parts) > 1 else ""
        if not target or target == top:
            continue
        contract = parts[2:] == ["contract"]
        if top in FLOORS:
            broken = target not in FLOORS[top]
        elif top in STAGES - ORCHESTRATORS:
            broken = (target in STAGES and not contract) or target == SHARED_STEPS
        elif top in ORCHESTRATORS or top == SHARED_STEPS:
            broken = target in ORCHESTRATORS and not contract
            broken = broken and target not in BUILDS_ON.get(top, set())
        else:
            broken = False  # the CLI and the spec page sit above every stage
        if broken:
            bad.append(module)
    return bad


def test_layering_checker_catches_what_it_should() -> None:
    assert layering_violations("compare", "from gpu_simulate_test.real_bench.stage import run")
    assert layering_violations("compare", "import gpu_simulate_test.vidur_simulate.plan")
    assert layering_violations("core", "from gpu_simulate_test.compare import contract")
    assert layering_violations("io", "from gpu_simulate_test.config.schema import X")
    assert not layering_violations("compare", "from gpu_simulate_test.real_bench import contract")
    assert not layering_violations("compare", "from gpu_simulate_test.core.engines.knobs import x")
    assert not layering_violations("pipeline", "from gpu_simulate_test.compare.stage import run")
    assert not layering_violations("tune", "from gpu_simulate_test.capacity.search import x")
    assert layering_violations("tune", "from gpu_simulate_test.fidelity.stage import run")
    assert layering_violations("capacity", "from gpu_simulate_test.tune.space import x")
    # every imported name is judged: a contract beside it excuses nothing
    both = "from gpu_simulate_test.real_bench import contract, metrics"
    assert layering_violations("compare", both) == ["gpu_simulate_test.real_bench.metrics"]
    assert layering_violations("compare", "from gpu_simulate_test import real_bench")
    # a name that is no submodule is a symbol of the package: the package, not its contract
    assert layering_violations("workload", "from gpu_simulate_test.compare import run_compare")
    assert layering_violations("fidelity", "from gpu_simulate_test.pipeline import sweep, contract")
    # orchestrators share steps through orchestrate, not through each other
    assert layering_violations("capacity", "from gpu_simulate_test.fidelity.tables import x")
    assert layering_violations("pipeline", "import gpu_simulate_test.capacity.search")
    assert layering_violations("orchestrate", "from gpu_simulate_test.fidelity import tables")
    assert not layering_violations("capacity", "from gpu_simulate_test.fidelity import contract")
    assert not layering_violations("capacity", "from gpu_simulate_test.orchestrate import steps")
    assert not layering_violations("orchestrate", "from gpu_simulate_test.real_bench import stage")
    assert not layering_violations(
        "orchestrate", "from gpu_simulate_test.core.engines import knobs"
    )
    # ... and nothing below them reaches the shared steps
    for low in ("core", "io", "config", "compare", "real_bench"):
        assert layering_violations(low, "from gpu_simulate_test.orchestrate.steps import x"), low


def test_no_stage_imports_another_stage_and_io_imports_nothing_above_it() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        top = rel.parts[0] if len(rel.parts) > 1 else rel.stem
        bad = layering_violations(top, path.read_text())
        if bad:
            found[str(rel)] = bad
    assert not found


def test_every_stage_has_a_stage_and_a_contract_module() -> None:
    for stage in sorted(STAGES):
        assert (PACKAGE / stage / "stage.py").is_file(), stage
        assert (PACKAGE / stage / "contract.py").is_file(), stage
    # the shared steps are no stage; every folder of code is one the import rules place
    assert not (PACKAGE / SHARED_STEPS / "stage.py").exists()
    folders = {path.parent.name for path in PACKAGE.glob("*/*.py")}
    assert folders == STAGES | set(FLOORS) | {SHARED_STEPS, "cli"}


def test_unit_tests_mirror_the_package() -> None:
    """``tests/unit/<folder>/`` holds the tests of ``src/gpu_simulate_test/<folder>/``; only the
    tests of the whole package (its layout, code shape, docs, spec page) sit at the top."""
    tests = REPO / "tests" / "unit"
    folders = {p.parent.relative_to(tests) for p in tests.rglob("test_*.py")} - {Path(".")}
    assert folders, "no test folder found"
    assert not [str(f) for f in folders if not (PACKAGE / f).is_dir()]
    top = {p.stem for p in tests.glob("test_*.py")}
    assert top <= {"test_layout", "test_code_shape", "test_library_docs", "test_spec_page"}
