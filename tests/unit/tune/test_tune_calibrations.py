"""``tune.calibrations``: the median calibration among several, and what the record and its
sentence say of the others."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.tune import TuneOptions
from gpu_simulate_test.tune.calibrations import (
    bundle_root,
    ensemble_record,
    level,
    median_index,
)
from gpu_simulate_test.tune.report import calibrations_sentence
from gpu_simulate_test.tune.simulate import Simulated
from tests.unit.tune.test_tune import sim


def _run(index: int, capacities: dict[str, float | None]) -> tuple[Any, list[Simulated], None]:
    calibration = SimpleNamespace(
        index=index, inner_cal=SimpleNamespace(profiling_root=f"p{index}")
    )
    return calibration, [sim(c, qps, 50) for c, qps in capacities.items()], None


def test_the_option_is_a_small_whole_number() -> None:
    assert TuneOptions().calibrations == 1
    assert TuneOptions(calibrations=3).calibrations == 3
    for bad in (0, 10, 2.5, "3"):
        with pytest.raises(ConfigError, match=r"tune\.calibrations=.* from 1 to 9"):
            TuneOptions(calibrations=bad)  # type: ignore[arg-type]


def test_the_bundles_live_beside_the_first() -> None:
    assert bundle_root("profiles", 1) == "profiles"
    assert bundle_root("profiles", 3) == "profiles/calibrations/3"


def test_the_median_is_the_middle_one_and_the_lower_middle_for_an_even_count() -> None:
    assert median_index([1.0, 0.8, 1.3]) == 0
    assert median_index([1.3, 1.0, 0.8]) == 1
    assert median_index([1.0, 0.8]) == 1  # the cautious one of two
    assert median_index([1.1, 0.9, 1.3, 1.0]) == 3
    assert median_index([2.0]) == 0


def test_a_level_is_the_geometric_mean_over_the_common_configurations() -> None:
    _, results, _ = _run(1, {"a": 10.0, "b": 40.0, "c": None})
    assert level(results, "capacity", ["a", "b"]) == pytest.approx(20.0)
    assert level(results, "capacity", ["b"]) == pytest.approx(40.0)


def test_the_record_keeps_every_calibration_s_scores_and_the_spread() -> None:
    runs = [
        _run(1, {"a": 10.0, "b": 40.0, "c": 5.0}),
        _run(2, {"a": 8.0, "b": 36.0, "c": None}),
        _run(3, {"a": 12.0, "b": 48.0, "c": 6.0}),
    ]
    common = ["a", "b"]
    levels = [level(res, "capacity", common) for _, res, _ in runs]
    at = median_index(levels)
    assert at == 0
    record = ensemble_record(runs, levels, at, "capacity", common)  # type: ignore[arg-type]
    assert record["chosen"] == 1 and record["count"] == 3
    assert record["bundles"] == ["p1", "p2", "p3"]
    assert record["levels"][0] == 1.0 and record["levels"][1] < 1.0 < record["levels"][2]
    assert record["scores"]["c"] == [5.0, None, 6.0]
    assert record["spread"]["a"] == pytest.approx(0.5) and record["spread"]["c"] == 0.2
    said = calibrations_sentence(record)
    assert "3 calibrations" in said and "calibration 1, which answers" in said
    assert "50% at most (a)" in said and "spreads 33%" in said  # median of 50%, 33%, 20%


def test_without_a_common_configuration_the_first_answers() -> None:
    runs = [_run(1, {"a": None}), _run(2, {"a": 3.0})]
    record = ensemble_record(runs, [], 0, "capacity", [])  # type: ignore[arg-type]
    assert record["chosen"] == 1 and record["levels"] is None
    assert "no configuration meets the goals with every one" in calibrations_sentence(record)
