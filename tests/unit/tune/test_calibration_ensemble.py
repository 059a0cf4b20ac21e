"""``tune.judge``: each calibration, the median one and the median per configuration judged
against the grids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_simulate_test.tune.judge import analyse, render


def _cal(root: Path, name: str, capacities: dict[str, float]) -> Path:
    run = root / name
    run.mkdir()
    lines = ["config_id,capacity_qps"] + [f"{c},{q}" for c, q in capacities.items()]
    (run / "tune.csv").write_text("\n".join(lines) + "\n")
    return run


def _grid(root: Path, name: str, measured: dict[str, float]) -> Path:
    run = root / name
    run.mkdir()
    configs = [{"config_id": c, "measured_qps": q} for c, q in measured.items()]
    (run / "tune.json").write_text(json.dumps({"verify": {"mode": "grid", "configs": configs}}))
    return run


def test_the_median_calibration_and_the_median_per_configuration(tmp_path: Path) -> None:
    cals = [
        _cal(tmp_path, "cal-1", {"a": 10.0, "b": 30.0}),  # slow: a -20%
        _cal(tmp_path, "cal-2", {"a": 12.0, "b": 42.0}),  # the middle level
        _cal(tmp_path, "cal-3", {"a": 14.0, "b": 35.0}),
    ]
    grids = [
        _grid(tmp_path, "g1", {"a": 12.0, "b": 40.0}),
        _grid(tmp_path, "g2", {"a": 13.0, "b": 40.0}),
    ]
    result = analyse(cals, grids)
    assert result["median_calibration"]["name"] == "cal-3"  # levels 17.3, 22.4, 22.1
    each = result["each"]
    assert each["cal-1"]["configs"]["a"]["error"] == pytest.approx(10 / 12.5 - 1)
    assert not each["cal-1"]["configs"]["a"]["ok"]  # -20% beyond 15% and the 8.3% spread
    assert each["cal-2"]["within"] == 2 and each["cal-2"]["best_in_top2"]
    per = result["median_per_configuration"]
    assert per["configs"]["a"]["simulated"] == 12.0 and per["configs"]["b"]["simulated"] == 35.0
    text = render(result)
    assert "| a | 12 / 13 |" in text and "**✗**" in text and "**cal-3**" in text


def test_a_run_that_is_not_a_grid_names_itself(tmp_path: Path) -> None:
    cal = _cal(tmp_path, "cal-1", {"a": 1.0})
    run = tmp_path / "top"
    run.mkdir()
    (run / "tune.json").write_text(json.dumps({"verify": {"mode": "top_k", "configs": []}}))
    with pytest.raises(SystemExit, match=r"not a tune\.verify=grid run"):
        analyse([cal], [run])
