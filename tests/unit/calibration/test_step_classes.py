"""``calibration.step_classes``: a step's class from what it holds, and each class's measured
time over the model's on a real vLLM step record (tests/data)."""

from __future__ import annotations

import pandas as pd
import pytest

from gpu_simulate_test.calibration.level import step_level
from gpu_simulate_test.calibration.step_classes import classes, step_class
from tests.unit.calibration.test_level import DATA, fitted_model, slower


def test_a_step_is_classed_by_what_it_holds() -> None:
    assert step_class(((1, 40), (1, 17))) == "decode"
    assert step_class(((32, 32),)) == "first chunk"
    assert step_class(((24, 24), (1, 40))) == "first chunk + decodes"
    assert step_class(((20, 52),)) == "later chunk"
    assert step_class(((20, 52), (10, 10), (1, 33))) == "later chunk + decodes"


def test_classes_add_up_to_the_servers_level_and_move_with_its_steps() -> None:
    steps = pd.read_csv(DATA / "engine_schedule.csv")
    predict = fitted_model(steps)
    table = classes([steps], (predict, None))
    level = step_level([steps], predict, None)
    assert level is not None and int(table["steps"].sum()) == level["steps"]
    total = table["measured_s"].sum() / table["modelled_s"].sum()
    assert total == pytest.approx(level["ratio"], abs=1e-4)
    assert table["share"].sum() == pytest.approx(1.0)
    slow = classes([slower(steps, 1.25)], (predict, None))
    assert (slow["ratio"] / table["ratio"]).to_numpy() == pytest.approx(1.25, rel=0.01)
