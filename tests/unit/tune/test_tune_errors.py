"""benchmarks/tune_errors.py: a configuration's errors over calibrations, and the verdict."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_simulate_test.tune.grid_errors import analyse, render


def _folder(root: Path, name: str, rows: dict[str, tuple[float, list[float]]]) -> Path:
    folder = root / name
    for k in range(2):
        configs = [
            {"config_id": c, "simulated_qps": sim, "measured_qps": measured[k]}
            for c, (sim, measured) in rows.items()
        ]
        path = folder / f"grid{k}" / "tune.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"verify": {"mode": "grid", "configs": configs}}))
    return folder


def test_one_signed_beyond_the_spread_is_a_gap_both_signs_are_noise(tmp_path: Path) -> None:
    a = _folder(tmp_path, "a", {"low": (8.0, [10.0, 10.0]), "both": (11.0, [10.0, 10.0])})
    b = _folder(tmp_path, "b", {"low": (9.0, [10.0, 10.0]), "both": (9.0, [10.0, 10.0])})
    result = analyse([a, b])
    low, both = result["configs"]["low"], result["configs"]["both"]
    assert low["errors"] == {"a": -0.2, "b": -0.1}
    assert (low["above"], low["below"]) == (0, 2)
    assert low["verdict"] == "model gap"
    assert both["verdict"] == "noise"
    assert result["calibration_mean_error"] == {"a": -0.05, "b": -0.1}
    assert "| low | -20.0% | -10.0% |" in render(result)


def test_an_error_within_the_truths_spread_is_noise(tmp_path: Path) -> None:
    a = _folder(tmp_path, "a", {"x": (9.0, [8.0, 12.0]), "y": (10.0, [10.0, 10.0])})
    b = _folder(tmp_path, "b", {"x": (9.5, [8.0, 12.0]), "y": (10.0, [10.0, 10.0])})
    assert analyse([a, b])["configs"]["x"]["verdict"] == "noise"  # mean −7.5%, truth CV 20%


def test_a_folder_without_grids_names_itself(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no grid"):
        analyse([tmp_path])
    path = tmp_path / "grid0" / "tune.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"verify": {"mode": "top_k", "configs": []}}))
    with pytest.raises(ValueError, match="expected 'grid'"):
        analyse([tmp_path])
