"""The intake by phase (issue 64): a send in its step's first part (vLLM's scheduling, one core
busy) adds nothing; one past it adds the API server's intake. The calibration keeps each send's
offset into its step, the fit recovers a planted free part and intake (and a free part of 0
where every send costs the same), and the step model adds the intake only past the free part."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.calibration import intake_phase, serving_load, serving_replay
from gpu_simulate_test.calibration.serving_load import ServingLoad
from gpu_simulate_test.simulator.step_model import BatchTimer, PredictorClock
from gpu_simulate_test.simulator.types import Composition
from tests.unit.calibration.test_serving_load import planted, schedule

OFFSETS = intake_phase.CLIENT_SEND_OFFSETS


def test_the_replays_steps_keep_each_sends_offset_into_its_step() -> None:
    steps = schedule()
    start, end = steps["start_time_s"].to_numpy(), steps["end_time_s"].to_numpy()
    sends = [start[3] + 1e-4, start[3] + 2.5e-4, end[3], end[10] - 1e-6]
    table = serving_replay.serving_steps(steps, [(5.0, 0.0, float(end[-1]))], "vllm", sends)
    cells = table[OFFSETS].tolist()
    assert intake_phase.parse_offsets(cells[3]) == pytest.approx([0.1, 0.25], abs=1e-3)
    assert cells[4] == "" and intake_phase.parse_offsets(cells[4]).size == 0
    tenth = (end[10] - start[10]) * 1e3 - 1e-3
    assert intake_phase.parse_offsets(cells[10]) == pytest.approx([tenth], abs=2e-3)
    late = intake_phase.late_sends(intake_phase.step_offsets(table) or [], 0.2)
    assert late[3] == 1 and late[10] == 1 and late.sum() == 2
    assert intake_phase.parse_offsets(float("nan")).size == 0  # pandas reads empty as NaN
    features = serving_load.step_features(table.reset_index(drop=True))
    assert features[OFFSETS].tolist() == cells


def phased(
    free_ms: float,
    intake_ms: float = 1.5,
    seed: int = 0,
    means: tuple[float, float, float] = (0.2, 0.5, 0.8),
    long_only: bool = False,
) -> tuple[pd.DataFrame, Any, Any]:
    """:func:`planted`'s steps with Poisson sends (``means`` per rate) at uniform offsets into
    their steps, each past ``free_ms`` adding ``intake_ms``; with ``long_only`` only in the steps
    predicted longer than the median."""
    frame, pred, group = planted(seed=seed)
    rng = np.random.default_rng(seed + 7)
    sends = rng.poisson(np.array(means)[group.astype(int)])
    if long_only:
        sends = np.where(pred > np.median(pred), sends, 0)
    length_ms = frame["body_s"].to_numpy() * 1e3
    cells, added = [], np.zeros(len(frame))
    for k, n in enumerate(sends):
        offsets = np.sort(rng.uniform(0.0, length_ms[k], n))
        added[k] = intake_ms * float(np.sum(offsets >= free_ms))
        cells.append(intake_phase.format_offsets(offsets))
    frame["client_sends"] = sends
    frame[OFFSETS] = cells
    frame["body_s"] = frame["body_s"] + added / 1e3
    return frame, pred, group


def test_the_fit_recovers_a_planted_free_part_and_the_intake_past_it() -> None:
    frame, pred, group = phased(free_ms=3.0)
    load = serving_load.fit(frame, pred, group)
    assert load.intake_free_ms == pytest.approx(3.0, abs=0.5)
    assert load.intake_ms == pytest.approx(1.5, abs=0.2)
    assert load.stretch_points == pytest.approx((1.0, 1.1, 1.4), abs=0.02)
    modelled = serving_load.modelled_s(load, frame, pred)
    assert abs(modelled.sum() / frame["body_s"].sum() - 1) < 0.01
    # the offsets not recorded (a calibration before 17): the intake of every send, smaller
    blind = serving_load.fit(frame.drop(columns=OFFSETS), pred, group)
    assert blind.intake_free_ms == 0.0 and blind.intake_ms < load.intake_ms - 0.2


def test_a_send_that_costs_the_same_anywhere_fits_no_free_part() -> None:
    frame, pred, group = phased(free_ms=0.0, seed=2)
    load = serving_load.fit(frame, pred, group)
    assert load.intake_free_ms <= 0.5
    assert load.intake_ms == pytest.approx(1.5, abs=0.2)
    none = serving_load.fit(phased(free_ms=0.0, intake_ms=0.0, seed=3)[0], pred, group)
    assert none.intake_ms < 0.2


def test_too_few_sends_fit_no_intake() -> None:
    frame, pred, group = phased(free_ms=3.0)
    frame = frame.assign(client_sends=0, **{OFFSETS: ""})
    frame.loc[:5, "client_sends"] = 1
    frame.loc[:5, OFFSETS] = "4.000"
    load = serving_load.fit(frame, pred, group)
    assert load.intake_ms == 0.0 and load.intake_free_ms == 0.0


def _timer() -> BatchTimer:
    def base(shape: Any, _: int) -> Any:
        return SimpleNamespace(total_time=6e-3 + 1e-5 * sum(shape.num_q_tokens))

    return BatchTimer(base, granularity=16)


LOAD = ServingLoad(
    rate_points=(1.0,),
    stretch_points=(1.0,),
    gap_points_ms=(0.0,),
    intake_ms=1.5,
    intake_free_ms=3.0,
)


def test_the_step_model_adds_the_intake_only_past_the_free_part() -> None:
    # steps start at 10, 30 and 50 ms (about 6 ms each): a send 1 ms in, one 4 ms in, and
    # one 2.9 ms and one 3.1 ms in
    sends = [0.011, 0.034, 0.0529, 0.0531]
    clock = PredictorClock(_timer(), LOAD, sends=sends)
    plain = PredictorClock(_timer(), LOAD)
    for start, expected in ((0.010, 0), (0.030, 1), (0.050, 1)):
        step = Composition(0, 0, 1, 1, ((1, 40),), start_s=start)
        assert clock.body(0, step) - plain.body(0, step) == pytest.approx(expected * 1.5e-3)
    everywhere = PredictorClock(_timer(), replace(LOAD, intake_free_ms=0.0), sends=sends)
    step = Composition(0, 0, 1, 1, ((1, 40),), start_s=0.010)
    assert everywhere.body(0, step) - plain.body(0, step) == pytest.approx(1.5e-3)
    longer = PredictorClock(_timer(), replace(LOAD, intake_free_ms=50.0), sends=sends)
    assert longer.body(0, step) == pytest.approx(plain.body(0, step))  # never below none


def test_the_intake_knob_off_drops_the_offsets_too() -> None:
    from gpu_simulate_test.vidur_simulate.inputs import serving_steps_of

    steps = schedule().assign(client_sends=1, **{OFFSETS: "4.0"})
    off = serving_steps_of(steps, intake=False)
    assert off is not None and OFFSETS not in off.columns and "client_sends" not in off.columns
    assert serving_steps_of(steps, intake=True) is steps
