"""bench_intake_step: the fitted extra of a busy step taking a request in per calibration, and
every clock row read over several simulation seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from benchmarks.fidelity.bench_intake_step import over_seeds, settings, terms


def test_the_rows_over_seeds_keep_each_seed_and_average_them() -> None:
    per_seed = [
        {"engine/ttft/p90": {"runs": 20, "mean": 0.054, "sd": 0.09, "within": 11}},
        {"engine/ttft/p90": {"runs": 20, "mean": 0.010, "sd": 0.08, "within": 14}},
        {"engine/ttft/p90": {"runs": 20, "mean": 0.032, "sd": 0.09, "within": 15}},
    ]
    row = over_seeds(per_seed)["engine/ttft/p90"]
    assert row["seed_means"] == [0.054, 0.010, 0.032]
    assert row["mean"] == pytest.approx(0.032)
    assert (row["low"], row["high"]) == (0.010, 0.054)
    assert row["within"] == pytest.approx(40 / 3) and row["seeds"] == 3 and row["runs"] == 20


def test_a_setting_names_one_pattern_per_seed() -> None:
    assert settings(["on=a-{run},b-{run}"]) == {"on": ["a-{run}", "b-{run}"]}
    with pytest.raises(SystemExit, match="with \\{run\\} in each"):
        settings(["on=a-{run},b"])


def test_the_terms_are_read_from_each_simulation(tmp_path: Path) -> None:
    dirs = []
    for k, ms in enumerate([0.5, -0.1, 0.2]):
        d = tmp_path / f"sim{k}"
        d.mkdir()
        meta = {"serving_load": {"terms": {"intake_step_ms": ms}}}
        (d / "run_meta.json").write_text(json.dumps(meta))
        dirs.append(d)
    t = terms(dirs)
    assert t["values_ms"] == [0.5, -0.1, 0.2] and t["median_ms"] == pytest.approx(0.2)
    assert t["above_zero"] == 2 and t["mean_ms"] == pytest.approx(0.2)
