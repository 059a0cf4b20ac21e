"""``tmp/latest``: the newest pipeline's compare run, found without reading ``run_meta.json``."""

from __future__ import annotations

import os
from pathlib import Path

from gpu_simulate_test.io import layout


def test_latest_points_at_the_newest_run_by_a_relative_link(tmp_path: Path) -> None:
    root = tmp_path / "tmp"
    first, second = root / "compare" / "a", root / "compare" / "b"
    for run in (first, second):
        run.mkdir(parents=True)
        (run / "summary.md").write_text(run.name)
    link = layout.point_latest(root, first)
    assert link == root / "latest" and (link / "summary.md").read_text() == "a"
    layout.point_latest(root, second)  # swapped in place
    assert (link / "summary.md").read_text() == "b"
    assert os.readlink(link) == os.path.join("compare", "b")  # moves with the folder
    assert sorted(p.name for p in root.iterdir()) == ["compare", "latest"]  # nothing staged left
