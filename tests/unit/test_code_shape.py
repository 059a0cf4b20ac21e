"""The shape a maintainer can carry: no import cycle among ``src/`` modules (lazy imports inside
functions count), no function over 100 lines, no module over 500, and no module-level mutable
state (a dict, list or set a module builds at import and anyone may change: a constant table is a
``MappingProxyType``, a tuple or a frozenset; only ``__all__`` is let off).

Each check reads the source with :mod:`ast` only (nothing is imported), and each has a test that
feeds it a small tree breaking the rule, so a check that stopped seeing would fail too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_FUNCTION_LINES = 100
MAX_MODULE_LINES = 500
MUTABLE_CALLS = frozenset(
    {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "bytearray"}
)
"""Calls (by name, bare or as an attribute: ``collections.deque``) building a mutable container."""
MUTABLE_LITERALS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under ``root`` (a package is its
    ``__init__``)."""
    found: dict[str, Path] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imported(name: str, path: Path, known: dict[str, Path]) -> Iterator[str]:
    """The known modules ``name`` imports anywhere in its file (``from x import y`` counts as
    ``x.y`` where that is a module, else as ``x``)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    yield full
                elif base in known:
                    yield base


def import_cycles(root: Path) -> list[list[str]]:
    """Every strongly connected set of two or more modules in the import graph (Tarjan)."""
    known = modules(root)
    graph = {name: set(_imported(name, path, known)) - {name} for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def long_functions(root: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``file:line name (n lines)`` for every function or method longer than ``limit``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    found.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length})")
    return found


def long_modules(root: Path, limit: int = MAX_MODULE_LINES) -> list[str]:
    """``file (n lines)`` for every module longer than ``limit``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        length = len(path.read_text(encoding="utf-8").splitlines())
        if length > limit:
            found.append(f"{path.relative_to(root)} ({length})")
    return found


def _module_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """The statements run at import: ``body`` and what ``if``/``try``/``with``/``for`` blocks
    hold, never a function's or a class's body."""
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            continue
        yield node
        for field in ("body", "orelse", "finalbody", "handlers"):
            inner = getattr(node, field, None)
            if isinstance(inner, list):
                yield from _module_level(inner)


def _mutable(value: ast.expr) -> bool:
    if isinstance(value, MUTABLE_LITERALS):
        return True
    if isinstance(value, ast.Call):
        func = value.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        return name in MUTABLE_CALLS
    return False


def mutable_globals(root: Path) -> list[str]:
    """``file:line NAME`` for every module-level assignment of a mutable container (a dict, list
    or set literal or comprehension, or a call of :data:`MUTABLE_CALLS`); ``__all__`` is exempt."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in _module_level(ast.parse(path.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Assign):
                targets, value = node.targets, node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                targets, value = [node.target], node.value
            else:
                continue
            if not _mutable(value):
                continue
            for target in targets:
                for name in ast.walk(target):
                    if isinstance(name, ast.Name) and name.id != "__all__":
                        found.append(f"{path.relative_to(root)}:{node.lineno} {name.id}")
    return found


def test_no_import_cycle_among_src_modules() -> None:
    assert import_cycles(SRC) == []


def test_no_function_over_100_lines() -> None:
    assert long_functions(SRC) == []


def test_no_module_over_500_lines() -> None:
    assert long_modules(SRC) == []


def test_no_mutable_module_state() -> None:
    assert mutable_globals(SRC) == []


@pytest.fixture
def bad_tree(tmp_path: Path) -> Path:
    """A package breaking every rule: a lazy import cycle, a long function, a long module, a
    module-level dict and list (beside read-only tables and a function's own dict, all fine)."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import helper\n")
    (pkg / "b.py").write_text("def helper():\n    from pkg import a\n    return a\n")
    (pkg / "c.py").write_text("from . import d\n")
    (pkg / "d.py").write_text("from .c import *\n")
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (pkg / "long.py").write_text(f"def f():\n{body}" + "\n" * MAX_MODULE_LINES)
    (pkg / "state.py").write_text(
        "import types\n"
        "__all__ = ['TABLE']\n"
        "TABLE: dict[str, int] = {'a': 1}\n"
        "if True:\n"
        "    SEEN = []\n"
        "NAMES = ('a', 'b')\n"
        "READ_ONLY = types.MappingProxyType({'a': 1})\n"
        "FROZEN = frozenset({'a'})\n"
        "def g():\n"
        "    local = {'a': 1}\n"
        "    return local\n"
        "class C:\n"
        "    table = {}\n"
    )
    return tmp_path


def test_the_checks_see_what_they_forbid(bad_tree: Path) -> None:
    assert sorted(import_cycles(bad_tree)) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"]]
    assert long_functions(bad_tree) == [f"pkg/long.py:1 f ({MAX_FUNCTION_LINES + 1})"]
    assert [entry.split(" ")[0] for entry in long_modules(bad_tree)] == ["pkg/long.py"]
    assert mutable_globals(bad_tree) == ["pkg/state.py:3 TABLE", "pkg/state.py:5 SEEN"]
