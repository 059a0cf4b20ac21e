"""The API server's intake (issue 64): each request the client sends while a step runs adds to
that step. The calibration keeps the sends beside the replays' steps, the fit recovers a planted
intake per send, and the step model adds it to the steps the sends fall in (an engine's own
share of them in a fleet), nowhere else."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.calibration import serving_load, serving_replay
from gpu_simulate_test.calibration.serving_load import ServingLoad
from gpu_simulate_test.simulator.api import EngineSpec, FleetSpec, Workload, simulate
from gpu_simulate_test.simulator.step_model import BatchTimer, PredictorClock, StepModel
from gpu_simulate_test.simulator.types import Composition, V1Params
from tests.unit.calibration.test_serving_load import planted, schedule


def test_the_replays_steps_count_the_sends_that_fell_in_them() -> None:
    steps = schedule()
    start, end = steps["start_time_s"].to_numpy(), steps["end_time_s"].to_numpy()
    sends = [start[3] + 1e-6, start[3] + 2e-6, end[3], float("nan"), end[10] - 1e-6]
    windows = [(5.0, 0.0, float(end[-1]))]
    table = serving_replay.serving_steps(steps, windows, "vllm", sends)
    counts = table[serving_load.CLIENT_SENDS].to_numpy()
    assert counts[3] == 2  # a step is [start, end): a send at its end is not in it
    assert start[4] > end[3] and counts[4] == 0  # nor in the next: it fell between the two
    assert counts[10] == 1 and counts.sum() == 3  # NaN (no send) counts nowhere
    assert serving_load.CLIENT_SENDS not in serving_replay.serving_steps(steps, windows, "vllm")
    features = serving_load.step_features(table[table["replay"] == 0].reset_index(drop=True))
    assert features["client_sends"].to_numpy() == pytest.approx(counts)


def with_sends(seed: int = 0, intake_ms: float = 1.5) -> tuple[pd.DataFrame, np.ndarray, Any]:
    """:func:`planted`'s steps with Poisson sends that add ``intake_ms`` each (wake-ups too)."""
    frame, pred, group = planted(seed=seed)
    rng = np.random.default_rng(seed + 1)
    sends = rng.poisson(np.array([0.1, 0.4, 0.8])[group.astype(int)])
    frame["client_sends"] = sends
    frame["body_s"] = frame["body_s"] + sends * intake_ms / 1e3
    return frame, pred, group


def test_the_fit_recovers_a_planted_intake_and_the_stretch_without_it() -> None:
    frame, pred, group = with_sends()
    load = serving_load.fit(frame, pred, group)
    assert load.intake_ms == pytest.approx(1.5, abs=0.15)
    assert load.stretch_points == pytest.approx((1.0, 1.1, 1.4), abs=0.02)
    assert load.wake0_ms == pytest.approx(1.0, abs=0.1)
    modelled = serving_load.modelled_s(load, frame, pred)
    assert abs(modelled.sum() / frame["body_s"].sum() - 1) < 0.01
    # without the sends recorded (a bundle before calibration version 12): no intake, and the
    # rates' stretch carries the sends' time on average
    blind = serving_load.fit(frame.drop(columns="client_sends"), pred, group)
    assert blind.intake_ms == 0.0
    assert blind.stretch_points[2] > load.stretch_points[2] + 0.05
    # none planted: none found (the noise alone moves the medians apart by less than 0.2 ms)
    frame0, pred0, group0 = with_sends(seed=4, intake_ms=0.0)
    assert serving_load.fit(frame0, pred0, group0).intake_ms < 0.2


def _timer() -> BatchTimer:
    def base(shape: Any, _: int) -> Any:
        return SimpleNamespace(total_time=2e-3 + 1e-5 * sum(shape.num_q_tokens))

    return BatchTimer(base, granularity=16)


LOAD = ServingLoad(rate_points=(1.0,), stretch_points=(1.0,), gap_points_ms=(0.0,), intake_ms=1.5)


def test_a_step_takes_in_the_sends_that_fall_in_it_and_only_those() -> None:
    sends = [0.0105, 0.011, float("nan"), 0.0301]
    clock = PredictorClock(_timer(), LOAD, sends=sends, scale=2.0)
    plain = PredictorClock(_timer(), LOAD, scale=2.0)
    for start, expected in ((0.010, 2), (0.026, 0), (0.0301, 1)):
        step = Composition(0, 0, 1, 1, ((1, 40),), start_s=start)
        with_intake, without = clock.body(0, step), plain.body(0, step)
        assert with_intake - without == pytest.approx(expected * 1.5e-3 * 2.0)  # at the level
        assert clock.decode_body(0, start, 1, 40) == with_intake
    half = PredictorClock(_timer(), LOAD, sends=sends, send_share=0.5)
    whole = PredictorClock(_timer(), replace(LOAD, intake_ms=0.0), sends=sends)
    step = Composition(0, 0, 1, 1, ((1, 40),), start_s=0.010)
    assert half.body(0, step) - whole.body(0, step) == pytest.approx(1.5e-3)


def test_the_simulator_times_a_burst_of_sends_slower_with_the_intake() -> None:
    """Ten requests sent 1 ms apart into a busy engine: their steps take in the sends, so they
    finish later than without the sends given; a fleet's replicas each take their share."""
    params = V1Params(max_num_batched_tokens=256, max_num_seqs=16, block_size=16, num_blocks=256)
    sent = np.arange(10) * 1e-3
    workload = Workload.of(sent + 2e-3, np.full(10, 32), np.full(10, 20))
    model = StepModel(_timer(), LOAD)
    blind = simulate(workload, model, EngineSpec(params))
    seen = simulate(replace(workload, sent_s=sent), model, EngineSpec(params))
    e2e = "request_e2e_time"
    assert (seen.requests[e2e] >= blind.requests[e2e]).all()
    assert seen.requests[e2e].mean() > blind.requests[e2e].mean() + 2e-3
    fleet = FleetSpec(replicas=2, router="round_robin")
    two = simulate(replace(workload, sent_s=sent), model, EngineSpec(params), fleet=fleet)
    two_blind = simulate(workload, model, EngineSpec(params), fleet=fleet)
    gained = two.requests[e2e].mean() - two_blind.requests[e2e].mean()
    assert 0 < gained < seen.requests[e2e].mean() - blind.requests[e2e].mean()


def test_the_intake_knob_fits_the_terms_as_before_version_12_when_off() -> None:
    from gpu_simulate_test.config.vidur import VidurConfig
    from gpu_simulate_test.vidur_simulate.inputs import serving_steps_of

    assert VidurConfig().serving_intake is True  # by phase since calibration 17 (docs)
    steps = schedule().assign(client_sends=1)
    assert serving_steps_of(steps, intake=True) is steps
    off = serving_steps_of(steps, intake=False)
    assert off is not None and serving_load.CLIENT_SENDS not in off.columns
    assert serving_load.CLIENT_SENDS in steps.columns  # the bundle's table is left as it is
    assert serving_steps_of(None, intake=False) is None
    old = schedule()  # a bundle before version 12: nothing to drop
    assert serving_steps_of(old, intake=False) is old
