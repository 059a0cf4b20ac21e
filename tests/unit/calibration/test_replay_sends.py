"""The calibration replays send their requests as the real bench sends them: against a server,
the short spin before each send (a 2 ms spin makes the client a CPU hog on the server's cores),
in process the long one."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_simulate_test.calibration import serving_replay
from gpu_simulate_test.core.engines import harness
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder


class _Engine:
    def __init__(self, in_process: bool) -> None:
        self.in_process = in_process
        self.sent: list[int] = []

    def submit(self, req: BenchRequest) -> None:
        self.sent.append(req.request_id)


@pytest.mark.parametrize(
    ("in_process", "spin"),
    [(False, harness.SPIN_WINDOW_OUT_OF_PROCESS_S), (True, harness.SPIN_WINDOW_S)],
)
def test_the_replays_spin_as_the_real_bench_does(
    monkeypatch: pytest.MonkeyPatch, in_process: bool, spin: float
) -> None:
    requests = tuple(BenchRequest(k, 8, 4, 0.001 * k) for k in range(3))
    spins: list[float] = []

    def waited(target: float, spin_window_s: float = harness.SPIN_WINDOW_S) -> float:
        spins.append(spin_window_s)
        return target

    def done(*args: Any, **kwargs: Any) -> None:
        return None

    monkeypatch.setattr(serving_replay, "wait_until", waited)
    monkeypatch.setattr(serving_replay, "wait", done)
    engine = _Engine(in_process)
    replays = [serving_replay.ServingReplay(10.0, requests)]
    windows = serving_replay.run(engine, Recorder(list(requests)), replays, 1.0)
    assert engine.sent == [0, 1, 2] and len(windows) == 1
    assert spins == [spin] * 3
    assert harness.spin_window_s(engine) == spin  # type: ignore[arg-type]
    assert harness.SPIN_WINDOW_OUT_OF_PROCESS_S < harness.SPIN_WINDOW_S
