"""One simulator interface: every loop honours :class:`Simulator`'s signature, the loop is chosen
in one place (:func:`simulator_for`) by scheduler and ``event_loop``, and our loop hands over to
Vidur's where it cannot follow, saying why, with KV-cache preemption one clear ConfigError.

The choice and the hand-over are checked on stand-ins (no Vidur run); the loops' own numbers are
checked against Vidur's in ``test_vidur_event_loop.py`` and ``test_vllm_v1*.py``."""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import pandas as pd
import pytest
from vidur.types import GlobalSchedulerType

from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.simulator.types import Composition, V1Params
from gpu_simulate_test.vidur_simulate import simulation
from gpu_simulate_test.vidur_simulate.loop_setup import KvCacheExhausted, NeedsVidurLoop
from gpu_simulate_test.vidur_simulate.simulation import HandOver, simulator_for
from gpu_simulate_test.vidur_simulate.simulator import (
    SimulationRequest,
    SimulationResult,
    Simulator,
)
from gpu_simulate_test.vidur_simulate.simulator_fast import FastLoopSimulator
from gpu_simulate_test.vidur_simulate.simulator_v1 import VllmV1Simulator
from gpu_simulate_test.vidur_simulate.simulator_vidur import VidurSimulator

SIMULATORS: tuple[type[Simulator], ...] = (
    VidurSimulator,
    FastLoopSimulator,
    VllmV1Simulator,
    HandOver,
)
"""Every loop, and the hand-over between two (mypy checks each against the protocol here)."""
V1 = V1Params(max_num_batched_tokens=64, max_num_seqs=4, block_size=16, num_blocks=64)


def config(replicas: int = 1, chrome_trace: bool = False) -> Any:
    """What :func:`.loop_setup.unsupported_reason` reads of Vidur's ``SimulationConfig``."""
    return SimpleNamespace(
        seed=1,
        time_limit=0,
        metrics_config=SimpleNamespace(enable_chrome_trace=chrome_trace, output_dir="unused"),
        cluster_config=SimpleNamespace(
            num_replicas=replicas,
            replica_config=SimpleNamespace(
                num_pipeline_stages=1, enable_sequence_pipeline_parallel=False
            ),
            global_scheduler_config=SimpleNamespace(
                get_type=lambda: GlobalSchedulerType.ROUND_ROBIN
            ),
        ),
    )


def result(loop: str = "vidur") -> SimulationResult:
    return SimulationResult(pd.DataFrame(), 0.0, 0.0, False, event_loop=loop)


class Replayed:
    """A real run's clock, as an oracle replay gives it."""

    def gap(self, index: int) -> float:
        return 0.0

    def lead(self, index: int) -> float:
        return 0.0

    def body(self, index: int, step: Composition) -> float:
        return 0.01

    def report(self) -> dict[str, Any]:
        return {"exact": True}


@pytest.mark.parametrize("cls", SIMULATORS, ids=lambda c: c.__name__)
def test_every_simulator_honours_the_interface(cls: type[Simulator]) -> None:
    expected = inspect.signature(Simulator.run)
    got = inspect.signature(cls.run)
    assert list(got.parameters) == list(expected.parameters) == ["self", "request"]
    assert got.parameters["request"].annotation == expected.parameters["request"].annotation
    assert got.return_annotation == expected.return_annotation
    assert callable(cls().run)  # each is built without arguments


@pytest.mark.parametrize(
    ("knobs", "chosen", "note"),
    [
        ({"v1": V1}, VllmV1Simulator, None),
        ({"event_loop": "vidur"}, VidurSimulator, None),
        ({"event_loop": "vidur", "lean_metrics": False}, VidurSimulator, None),
        ({}, HandOver, None),
        ({"simulation_config": config(replicas=2)}, VidurSimulator, "does not simulate 2 replicas"),
        ({"simulation_config": config(chrome_trace=True)}, VidurSimulator, "a chrome trace"),
    ],
)
def test_the_loop_is_chosen_by_scheduler_and_event_loop(
    knobs: dict[str, Any], chosen: type, note: str | None
) -> None:
    request = SimulationRequest(**{"simulation_config": config(), **knobs})
    simulator = simulator_for(request)
    assert type(simulator) is chosen
    if note is None:
        assert getattr(simulator, "note", None) is None
    else:
        assert isinstance(simulator, VidurSimulator) and simulator.note is not None
        assert simulator.note.startswith("Vidur's loop ran: our loop") and note in simulator.note


def test_what_cannot_run_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"vllm_v1 runs in our event loop only.*event_loop=vidur"):
        simulator_for(SimulationRequest(config(), v1=V1, event_loop="vidur"))
    with pytest.raises(ValueError, match=r"event_loop must be one of"):
        simulator_for(SimulationRequest(config(), event_loop="faster"))
    with pytest.raises(ConfigError, match=r"vidur\.step_time_scale=2\.0 scales predicted steps"):
        SimulationRequest(config(), v1=V1, replay_clock=Replayed(), step_time_scale=2.0)


def test_our_loop_hands_over_to_vidurs_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    def stuck(self: object, request: SimulationRequest) -> SimulationResult:
        raise NeedsVidurLoop("a state it does not follow")

    ran: list[SimulationRequest] = []

    def vidur(self: VidurSimulator, request: SimulationRequest) -> SimulationResult:
        ran.append(request)
        return result()

    monkeypatch.setattr(FastLoopSimulator, "run", lambda self, request: result("fast"))
    monkeypatch.setattr(VidurSimulator, "run", vidur)
    request = SimulationRequest(config())
    assert simulation.simulate(request).event_loop == "fast" and not ran
    monkeypatch.setattr(FastLoopSimulator, "run", stuck)
    handed = simulation.simulate(request)
    assert ran == [request]
    assert handed.event_loop == "vidur"
    assert handed.event_loop_note == "Vidur's loop ran: a state it does not follow"


def test_kv_cache_preemption_vidur_cannot_simulate_is_one_clear_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def exhausted(self: object, request: SimulationRequest) -> SimulationResult:
        raise KvCacheExhausted(0.5, 7, 3, 1, 40)

    def vidur_fails(self: object, request: SimulationRequest) -> SimulationResult:
        raise AssertionError("vidur's own")

    monkeypatch.setattr(FastLoopSimulator, "run", exhausted)
    monkeypatch.setattr(VidurSimulator, "run", vidur_fails)
    with pytest.raises(ConfigError, match=r"vidur\.scheduler\.num_blocks: the KV cache runs out"):
        simulation.simulate(SimulationRequest(config()))
    # Vidur's own failure, asked for directly, is not explained away
    with pytest.raises(AssertionError, match="vidur's own"):
        simulation.simulate(SimulationRequest(config(), event_loop="vidur"))
