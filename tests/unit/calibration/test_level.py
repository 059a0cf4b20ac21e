"""A server's step level against the simulation's step model (calibration/level): on a real vLLM
step record, a model fitted to the record itself reads about 1, the same steps taking 20% longer
read 1.2 times that, the serving terms divide the level, and too few steps give none."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.calibration import serving_load
from gpu_simulate_test.calibration.level import MIN_STEPS, Predict, step_level
from gpu_simulate_test.calibration.serving_load import ServingLoad
from gpu_simulate_test.tune.report import level_cell

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm" / "step_record"


def schedule() -> pd.DataFrame:
    return pd.read_csv(DATA / "engine_schedule.csv")


def fitted_model(steps: pd.DataFrame) -> Predict:
    """A step's time as a line in its query tokens and requests, fitted to ``steps`` itself."""
    f = serving_load.step_features(steps)
    q = np.array([sum(c[0] for c in chunks) for chunks in f["chunks"]], dtype=float)
    n = np.array([len(chunks) for chunks in f["chunks"]], dtype=float)
    coef, *_ = np.linalg.lstsq(np.column_stack([np.ones_like(q), q, n]), f["body_s"], rcond=None)

    def predict(chunks: Sequence[tuple[int, int]]) -> float:
        return float(coef @ [1.0, sum(c[0] for c in chunks), len(chunks)])

    return predict


def slower(steps: pd.DataFrame, factor: float) -> pd.DataFrame:
    """The same record with every step ``factor`` times as long (the pauses kept)."""
    out = steps.copy()
    length = (steps["end_time_s"] - steps["start_time_s"]).to_numpy()
    shift = np.concatenate([[0.0], np.cumsum(length * (factor - 1.0))[:-1]])
    out["start_time_s"] = steps["start_time_s"] + shift
    out["end_time_s"] = out["start_time_s"] + length * factor
    return out


def test_a_model_of_the_record_itself_reads_about_one_and_slower_steps_read_slower() -> None:
    steps = schedule()
    predict = fitted_model(steps)
    level = step_level([steps], predict, None)
    assert level is not None and 0.9 < level["ratio"] < 1.1
    assert level["steps"] > 500 and level["per_run"] == [level["ratio"]]
    slow = step_level([slower(steps, 1.2)], predict, None)
    assert slow is not None
    assert slow["ratio"] == pytest.approx(1.2 * level["ratio"], rel=2e-3)
    both = step_level([steps, slower(steps, 1.2)], predict, None)
    assert both is not None and level["ratio"] < both["ratio"] < slow["ratio"]
    assert both["per_run"] == [level["ratio"], slow["ratio"]]


def test_the_serving_terms_are_part_of_the_model() -> None:
    steps = schedule()
    predict = fitted_model(steps)
    plain = step_level([steps], predict, None)
    stretched = ServingLoad(rate_points=(1.0,), stretch_points=(1.5,), gap_points_ms=(0.0,))
    level = step_level([steps], predict, stretched)
    assert plain is not None and level is not None
    assert level["ratio"] == pytest.approx(plain["ratio"] / 1.5, rel=0.02)  # wake-ups aside


def test_too_few_steps_give_no_level() -> None:
    steps = schedule().head(MIN_STEPS // 2)
    assert step_level([steps], fitted_model(schedule()), None) is None
    assert step_level([], fitted_model(schedule()), None) is None


def test_the_report_cell() -> None:
    assert level_cell(None) == "–"
    assert level_cell({"ratio": 1.0935, "steps": 2797, "per_run": [0.9973, 1.1763]}) == (
        "1.09× (runs 1.00–1.18)"
    )
    judged = {"ratio": 1.2513, "steps": 900, "rates": [21.14, 23.05]}
    three = {"ratio": 1.175, "steps": 3577, "per_run": [1.06, 1.28, 1.23], "judged": judged}
    assert level_cell(three) == "1.18× (runs 1.06–1.28; judged 1.25×)"
    # judged over every run: nothing more to say
    two = {"ratio": 1.0935, "steps": 2797, "per_run": [0.9973, 1.1763], "judged": judged}
    assert level_cell(two) == "1.09× (runs 1.00–1.18)"


def test_a_real_runs_sends_are_timed_in_its_steps_not_in_its_level(tmp_path: Path) -> None:
    """The intake a send adds to its step is the model's (with ``vidur.serving_intake``): the
    real run's steps are timed with the sends that fell in them, so a step the send stretched
    reads at the level of the others and the simulation does not add the intake twice."""
    import shutil

    from gpu_simulate_test.calibration.intake_phase import CLIENT_SEND_OFFSETS
    from gpu_simulate_test.orchestrate.step_level import run_schedule

    for name in ("engine_schedule.csv", "request_metrics.csv"):
        shutil.copy(DATA / name, tmp_path / name)
    steps = run_schedule(tmp_path)
    sent = pd.read_csv(DATA / "request_metrics.csv")["arrival_time_s"].to_numpy(float)
    inside = (sent >= steps["start_time_s"].min()) & (sent < steps["end_time_s"].max())
    assert 0 < steps["client_sends"].sum() <= inside.sum()
    with_offsets = steps[steps[CLIENT_SEND_OFFSETS] != ""]
    assert len(with_offsets) == int((steps["client_sends"] > 0).sum())
    predict = fitted_model(schedule())
    load = ServingLoad(rate_points=(1.0,), stretch_points=(1.0,), gap_points_ms=(0.0,))
    intake = dataclasses.replace(load, intake_ms=2.0)
    plain = step_level([steps], predict, load)
    counted = step_level([steps], predict, intake)
    blind = step_level([schedule()], predict, intake)  # no sends beside the steps
    assert plain is not None and counted is not None and blind is not None
    assert counted["ratio"] < plain["ratio"] - 0.005
    assert blind["ratio"] == pytest.approx(plain["ratio"])
    (tmp_path / "request_metrics.csv").unlink()
    assert "client_sends" not in run_schedule(tmp_path)
