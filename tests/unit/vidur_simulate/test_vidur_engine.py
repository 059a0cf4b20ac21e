"""Vidur's loop as an engine a caller steps (:class:`.vidur_engine.VidurEngine`) is
``Simulator.run`` event for event: the stage writes the same bytes through either (Vidur's own
metrics store, its chrome trace, the engine overhead), and requests added one at a time, each
just before its arrival is due, give the same requests as all added at once."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.io import layout
from gpu_simulate_test.vidur_simulate import simulation
from gpu_simulate_test.vidur_simulate.simulator_vidur import VidurSimulator
from gpu_simulate_test.vidur_simulate.vidur_engine import VidurEngine
from tests.unit.vidur_simulate.test_vidur_event_loop import (  # noqa: F401 (a fixture)
    CASES,
    arrivals,
    bundles,
    simulate,
)
from tests.vidur_bundle_factory import write_workload_run

OUTPUTS = (layout.REQUEST_METRICS, layout.ENGINE_STEP_LOG)


def workload(tmp_path: Path, case: str) -> tuple[Path, Any, bool]:
    scheduler, n, qps, prompt, output, overhead = CASES[case]
    rng = np.random.default_rng(11)
    run = write_workload_run(
        tmp_path,
        f"w-{case}",
        rng.integers(prompt[0], prompt[1] + 1, n),
        rng.integers(output[0], output[1] + 1, n),
        arrivals(rng, n, qps),
    )
    return run, scheduler, overhead


@pytest.mark.parametrize(
    ("case", "chrome_trace"),
    [("vllm-overhead", False), ("sarathi-light", True), ("orca-cap8", False)],
)
def test_stepped_engine_is_simulator_run(
    bundles: dict[bool, Path],  # noqa: F811 (the fixture)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    case: str,
    chrome_trace: bool,
) -> None:
    run, scheduler, overhead = workload(tmp_path, case)
    outs = {}
    for stepped in (True, False):
        chosen = functools.partial(VidurSimulator, stepped=stepped)
        monkeypatch.setattr(simulation, "VidurSimulator", chosen)
        outs[stepped] = simulate(
            tmp_path, f"{case}-{stepped}", run, bundles[overhead], scheduler, "vidur", overhead,
            chrome_trace=chrome_trace,
        )  # fmt: skip
    for name in OUTPUTS:
        assert (outs[True] / name).read_bytes() == (outs[False] / name).read_bytes(), name
    frame = pd.read_csv(outs[True] / layout.REQUEST_METRICS)
    assert len(frame) == CASES[case][1]
    assert frame["ttft_s"].gt(0).all()


def test_requests_added_one_at_a_time_as_a_router_would(
    bundles: dict[bool, Path],  # noqa: F811 (the fixture)
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller that adds each request when its arrival is due (a router in front) and reads
    the engine's state between events gets the same requests; the state a router reads moves."""
    run, scheduler, overhead = workload(tmp_path, "vllm-overhead")
    seen: list[tuple[int, int, float]] = []

    class OneAtATime(VidurSimulator):
        def run(self, request: Any) -> Any:
            original = VidurEngine.add_all

            def add_when_due(engine: VidurEngine) -> None:
                for r in engine.request_ids:
                    at = engine._arrivals[r].time
                    engine.advance(until=at)
                    seen.append((engine.num_waiting, engine.num_running, engine.kv_usage()))
                    engine.add(r, at)

            monkeypatch.setattr(VidurEngine, "add_all", add_when_due)
            try:
                return super().run(request)
            finally:
                monkeypatch.setattr(VidurEngine, "add_all", original)

    monkeypatch.setattr(simulation, "VidurSimulator", VidurSimulator)
    whole = simulate(tmp_path, "whole", run, bundles[overhead], scheduler, "vidur", overhead)
    monkeypatch.setattr(simulation, "VidurSimulator", OneAtATime)
    each = simulate(tmp_path, "each", run, bundles[overhead], scheduler, "vidur", overhead)
    for name in OUTPUTS:
        assert (each / name).read_bytes() == (whole / name).read_bytes(), name
    assert len(seen) == CASES["vllm-overhead"][1]
    assert max(w for w, _, _ in seen) + max(n for _, n, _ in seen) > 1  # a queue formed
    assert 0 < max(u for _, _, u in seen) <= 1
