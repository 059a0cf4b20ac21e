"""How each part of the first token moves with the host's level (issue 64): the line through
the runs' log ratios, and the front end pooled over the runs' requests."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from benchmarks.fidelity import bench_at_level, bench_level_parts


def test_the_slope_is_the_parts_elasticity_to_the_level() -> None:
    levels = [0.9, 1.0, 1.1, 1.2]
    sim = [10.0, 10.0, 10.0, 10.0]
    moves = [10.0 * lv for lv in levels]  # moves with the host as the steps do
    still = [10.5] * 4  # does not move, 5% long
    one = bench_level_parts.elasticity(levels, moves, sim)
    assert one["slope"] == pytest.approx(1.0) and one["correlation"] == pytest.approx(1.0)
    assert one["left"] == pytest.approx(0.0, abs=1e-6) and one["runs"] == 4
    none = bench_level_parts.elasticity(levels, still, sim)
    assert none["slope"] == pytest.approx(0.0, abs=1e-9) and math.isnan(none["correlation"])
    assert none["mean_ratio"] == pytest.approx(0.05)
    assert bench_level_parts.elasticity(levels[:2], moves[:2], sim[:2]) == {}  # too few runs
    assert bench_level_parts.elasticity([1.0, 0.0, 1.1], [1, 1, 1], [1, 1, 1]) == {}  # no level


def test_the_parts_and_the_levels_are_matched_by_run(tmp_path: Path) -> None:
    parts = {
        f"r{k}": {"front_end": {"real_mean_ms": 5.0 * lv, "sim_mean_ms": 5.0}}
        for k, lv in enumerate((0.9, 1.0, 1.2))
    }
    parts["pooled"] = {"front_end": {"real_mean_ms": 1.0, "sim_mean_ms": 2.0}}  # not a run
    jobs = {"results": [{"run": f"r{k}", "step_level": lv} for k, lv in enumerate((0.9, 1.0, 1.2))]}
    (tmp_path / "parts.json").write_text(json.dumps(parts))
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    out = tmp_path / "out.json"
    argv = ["--parts", str(tmp_path / "parts.json"), "--jobs", str(tmp_path / "jobs.json")]
    assert bench_level_parts.main([*argv, "--out", str(out)]) == 0
    record = json.loads(out.read_text())["by_part"]
    assert record["front_end"]["slope"] == pytest.approx(1.0) and record["front_end"]["runs"] == 3
    assert record["held"] == {}  # no run has it


def test_the_front_end_is_pooled_over_every_runs_requests() -> None:
    results = [
        {"front_end_ms": {"as_calibrated": {"real": [4.0, 6.0], "sim": [4.0, 6.0]},
                          "at_level": {"real": [4.0, 6.0], "sim": [5.0, 7.5]}}},
        {"front_end_ms": {"as_calibrated": {"real": [8.0], "sim": [8.0]},
                          "at_level": {"real": [8.0], "sim": [10.0]}}},
    ]  # fmt: skip
    calibrated, level = bench_at_level.pooled_front_end(results)
    assert "as calibrated, 3 requests pooled" in calibrated
    assert "mean 6.00 / 6.00 (+0.0%)" in calibrated
    assert "at level, 3 requests pooled" in level and "p50 6.00 / 7.50 (+25.0%)" in level
    assert bench_at_level.pooled_front_end([{"level": 1.0}]) == []  # a record of before
