"""Re-timing a profile (a busy machine, disturbed shapes) shows its progress: each round can take
as long as the profile itself."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import pytest

from gpu_simulate_test.config.schema import HardwareConfig
from gpu_simulate_test.config.vidur import VidurProfileStageConfig
from gpu_simulate_test.core.profiling.grid import ProfileGrid
from gpu_simulate_test.vidur_profile import stage
from gpu_simulate_test.vidur_profile.layer_ops import build_layer
from gpu_simulate_test.vidur_profile.profiler import ProfileTables, profile_tables
from gpu_simulate_test.vidur_profile.timing import TimingPolicy
from tests.unit.vidur_profile.test_vidur_profile_tables import SMALL

CPU = HardwareConfig(name="cpu", peak_bf16_tflops=1.0, memory_bandwidth_gb_s=20.0, memory_gib=8.0)
GRID = ProfileGrid(num_tokens=(1, 3), batch_sizes=(1, 2), prefill_chunks=(4,), kv_cache_sizes=(0,))


class Bars:
    """Records every progress bar drawn: its label, total and the shapes it was advanced by."""

    def __init__(self) -> None:
        self.drawn: list[tuple[str, int, list[int]]] = []

    @contextlib.contextmanager
    def __call__(self, description: str, total: int, enabled: bool = True) -> Iterator[Callable]:
        steps: list[int] = []
        self.drawn.append((description, total, steps))
        yield steps.append


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> tuple[object, ProfileTables, Bars]:
    import torch

    layer = build_layer(SMALL, "cpu", torch.float32)
    tables = profile_tables(layer, GRID, 16, TimingPolicy(warmup=0, repeats=1, min_repeats=1))
    bars = Bars()
    monkeypatch.setattr(stage, "progress_bar", bars)
    monkeypatch.setattr(stage, "wait_for_quiet", lambda _budget: (True, 0.0))
    return layer, tables, bars


def _cfg() -> VidurProfileStageConfig:
    return VidurProfileStageConfig(model=SMALL, hardware=CPU)


def test_retiming_a_busy_profile_draws_a_bar_per_round(
    quick: tuple[object, ProfileTables, Bars],
) -> None:
    layer, tables, bars = quick
    _, least = stage.retime_while_busy(layer, GRID, tables, _cfg(), busy=5.0)
    assert bars.drawn, "the whole grid timed again with no progress shown"
    label, total, steps = bars.drawn[0]
    assert "busy machine, round 1" in label
    assert total == GRID.num_shapes and sum(steps) == GRID.num_shapes
    assert least < 5.0 or len(bars.drawn) == _cfg().profiling.remeasure_rounds


def test_retiming_disturbed_shapes_draws_a_bar(
    quick: tuple[object, ProfileTables, Bars], monkeypatch: pytest.MonkeyPatch
) -> None:
    layer, tables, bars = quick
    none: set[tuple[int, int]] = set()
    found = iter([({3}, none, none), (set(), none, none)])
    monkeypatch.setattr(stage, "disturbed", lambda *_: next(found))
    _, done = stage.remeasure_disturbed(layer, GRID, tables, _cfg())
    assert done["rounds"] == 1 and done["shapes"] == 1
    assert [(label, total, sum(steps)) for label, total, steps in bars.drawn] == [
        ("re-timing disturbed shapes (round 1)", 1, 1)
    ]
