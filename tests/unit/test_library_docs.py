"""docs/library.md's example runs as written and prints what it says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_the_library_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "docs" / "library.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None, "docs/library.md has no python example"
    monkeypatch.chdir(ROOT)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.group(1), "docs/library.md", "exec"), {"__name__": "__main__"})
    printed = out.getvalue()
    for column in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert column in printed
    numbers = [float(x) for x in re.findall(r"\d+\.\d+", printed)]
    assert numbers and all(x >= 0 for x in numbers), printed
