"""The intake's catch (issue 64): a step whose end falls after a request's send and before the
request reaches the engine ends when it arrives, and the request goes into the next step, as
the real main jobs' busy requests did; off, the request waits a whole step."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpu_simulate_test.simulator.api import EngineSpec, Workload, simulate
from gpu_simulate_test.simulator.intake_catch import Intakes
from gpu_simulate_test.simulator.step_model import BatchTimer, StepModel
from gpu_simulate_test.simulator.types import V1Params

STEP_S = 8e-3
"""Every step of the toy timer (a decode step of the tiny model on this host)."""


def _timer() -> BatchTimer:
    def base(shape: Any, _: int) -> Any:
        return SimpleNamespace(total_time=STEP_S)

    return BatchTimer(base, granularity=16)


def test_an_end_moves_to_the_latest_arrival_under_way_and_again_from_there() -> None:
    sends = [0.010, 0.0135, float("nan"), 0.020]
    arrivals = [0.013, 0.0165, 0.5, 0.023]
    intakes = Intakes.of(sends, arrivals)
    assert intakes is not None and intakes.longest_s == pytest.approx(3e-3)
    assert intakes.end_s(0.009) == 0.009  # before every send: as timed
    assert intakes.end_s(0.012) == pytest.approx(0.013)  # one intake under way
    assert intakes.end_s(0.013) == 0.013  # it is in by then, the next not yet sent
    assert intakes.end_s(0.0134) == 0.0134
    assert intakes.end_s(0.014) == pytest.approx(0.0165)  # the second's
    assert intakes.end_s(0.0166) == 0.0166
    assert intakes.end_s(0.0201) == pytest.approx(0.023)
    chain = Intakes.of([0.010, 0.0125], [0.013, 0.0155])
    assert chain is not None  # at the first's arrival the second is under way: on to it
    assert chain.end_s(0.011) == pytest.approx(0.0155)
    assert Intakes.of(None, arrivals) is None and Intakes.of(sends, None) is None
    assert Intakes.of([float("nan")], [1.0]) is None
    with pytest.raises(ValueError, match="3 sends against 2 arrivals"):
        Intakes.of([0.0, 1.0, 2.0], [0.1, 1.1])


def test_a_request_sent_late_in_a_step_goes_into_the_next_step_with_the_catch() -> None:
    """A long request keeps the engine busy; a second is sent 1 ms before a step ends and takes
    3 ms to reach the engine. Without the catch it waits for the step after; with it the step
    ends when it arrives, and it is scheduled there."""
    params = V1Params(max_num_batched_tokens=256, max_num_seqs=16, block_size=16, num_blocks=256)
    # the first arrives at 0 and steps every 8 ms; the second is sent at 23 ms (the third step
    # ends at 24 ms) and reaches the engine at 26 ms
    sent = np.array([0.0, 0.023])
    arrival = sent + np.array([0.0, 0.003])
    workload = replace(Workload.of(arrival, np.full(2, 32), np.array([20, 4])), sent_s=sent)
    plain = simulate(workload, StepModel(_timer()), EngineSpec(params))
    caught = simulate(workload, StepModel(_timer(), intake_catch=True), EngineSpec(params))
    ttft = "prefill_e2e_time"
    waited = plain.requests[ttft].to_numpy()[1]
    taken = caught.requests[ttft].to_numpy()[1]
    assert waited == pytest.approx(0.032 - 0.026 + STEP_S, abs=1e-6)  # the step after next
    assert taken == pytest.approx(STEP_S, abs=1e-6)  # queued at its arrival, then one step
    starts = caught.schedule["start_time_s"].to_numpy()
    assert np.any(np.isclose(starts, 0.026))  # the third step ended at the arrival
    first = caught.requests[ttft].to_numpy()[0]
    assert first == pytest.approx(plain.requests[ttft].to_numpy()[0])  # nothing sent before it


def test_the_catch_is_off_by_default_and_reaches_the_stage_s_step_model() -> None:
    """Off by default (over-corrects on the main jobs: benchmarks/results/intake_catch_20261205);
    the stage's knob reaches the simulation request the step model is built from."""
    from gpu_simulate_test.config.vidur import VidurConfig
    from gpu_simulate_test.vidur_simulate.simulator import SimulationRequest

    assert VidurConfig().intake_catch is False
    fields = SimulationRequest.__dataclass_fields__
    assert "intake_catch" in fields and fields["intake_catch"].default is False
