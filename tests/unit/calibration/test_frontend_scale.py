"""The front end at another host speed (``vidur.frontend_time_scale``): every calibrated time
scaled, the counts kept; the simulation takes the scaled front end; the level's simulation
scales it where the engine runs on the host's CPU and leaves it on a GPU."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpu_simulate_test.calibration.frontend_queue import FrontEndQueue
from gpu_simulate_test.calibration.frontend_scale import (
    at_level,
    follows_steps,
    scaled_front_end,
    scaled_queue,
)
from gpu_simulate_test.calibration.overhead import FrontEnd
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.vidur import VidurConfig

FRONT = FrontEnd(
    input_ms=2.0,
    output_ms=1.5,
    input_per_running_ms=0.1,
    running_max=12.0,
    quiet_input_ms=1.8,
    input_idle_ms=2.5,
    input_residual_ms=((0, (-0.5, 0.0, 1.0)), (4, (-0.4, 0.2, 3.0))),
    busy_hop_residual_ms=((1, (-0.8, 0.1, 7.0)),),
)
QUEUE = FrontEndQueue(
    request_ms=0.9,
    step_ms=0.3,
    token_ms=0.05,
    first_ms=0.2,
    first_idle_residual_ms=(-0.3, 0.0, 2.0),
    first_busy_residual_ms=((1, (-0.2, 0.1, 4.0)),),
)


def _doubled(value: Any, scaled: Any) -> bool:
    if isinstance(value, tuple):
        return len(value) == len(scaled) and all(map(_doubled, value, scaled))
    if isinstance(value, int) and not isinstance(value, bool):  # a bucket's bound: kept
        return bool(scaled == value)
    return bool(scaled == pytest.approx(2.0 * value))


@pytest.mark.parametrize(("record", "scale"), [(FRONT, scaled_front_end), (QUEUE, scaled_queue)])
def test_every_time_is_scaled_and_the_counts_kept(record: Any, scale: Any) -> None:
    """Every field (a new one too) is checked: a time not scaled fails here."""
    scaled = scale(record, 2.0)
    for field in dataclasses.fields(record):
        value, got = getattr(record, field.name), getattr(scaled, field.name)
        if field.name == "running_max":  # requests in flight, not a time
            assert got == value
        else:
            assert _doubled(value, got), (field.name, value, got)
    assert scale(record, 1.0) is record and scale(None, 2.0) is None


def test_scaled_front_end_keeps_what_was_not_measured() -> None:
    front = FrontEnd(input_ms=2.0, output_ms=1.0)
    scaled = scaled_front_end(front, 1.5)
    assert scaled is not None and scaled.input_ms == pytest.approx(3.0)
    assert scaled.quiet_input_ms is None and scaled.input_idle_ms is None
    assert scaled.busy_hop_residual_ms == () and scaled.running_max == float("inf")


def test_the_front_end_follows_the_steps_only_on_the_hosts_cpu() -> None:
    assert follows_steps("cpu")
    assert not follows_steps("cuda") and not follows_steps("cuda:1")


def test_at_a_level_the_steps_scale_and_the_front_end_only_on_the_cpu() -> None:
    base = VidurConfig(seed=7)
    on_cpu, front = at_level(base, "cpu", 1.2)
    assert front and on_cpu.step_time_scale == 1.2 and on_cpu.frontend_time_scale == 1.2
    on_gpu, front = at_level(base, "cuda", 0.9)
    assert not front and on_gpu.step_time_scale == 0.9 and on_gpu.frontend_time_scale == 1.0
    # nothing else moves
    assert dataclasses.replace(on_cpu, step_time_scale=1.0, frontend_time_scale=1.0) == base


def test_the_scale_must_be_a_positive_factor() -> None:
    assert VidurConfig().frontend_time_scale == 1.0
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match=r"vidur\.frontend_time_scale=.* positive factor"):
            VidurConfig(frontend_time_scale=bad)


def test_the_simulation_takes_the_scaled_front_end(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prepare`` reads the calibration's front end and queue through the scale."""
    from gpu_simulate_test.vidur_simulate import stage
    from tests.unit.vidur_simulate.test_vidur_plan import ARRIVALS, DECODE, PREFILL
    from tests.unit.vidur_simulate.test_vidur_plan import stage as plan_stage
    from tests.vidur_bundle_factory import QWEN3_TINY, write_synthetic_bundle, write_workload_run

    write_workload_run(tmp_path, "w", PREFILL, DECODE, ARRIVALS)
    write_synthetic_bundle(tmp_path / "profiles", QWEN3_TINY, points=6)
    record = SimpleNamespace(
        steps=None, frontend=FRONT, frontend_queue=QUEUE, serving_steps=None, host_probe=None
    )
    monkeypatch.setattr(stage.CalibrationRecord, "load", lambda *args: record)
    base = plan_stage(tmp_path)
    seen = {}
    for factor in (1.0, 1.2):
        vidur = dataclasses.replace(
            base.vidur,
            scheduler=dataclasses.replace(base.vidur.scheduler, name="vllm_v1"),
            engine_overhead="vllm",
            step_jitter=False,
            serving_load=False,
            frontend_time_scale=factor,
        )
        seen[factor] = stage.prepare(dataclasses.replace(base, vidur=vidur))
    plain, scaled = seen[1.0], seen[1.2]
    assert plain.frontend is FRONT and plain.frontend_queue is QUEUE
    assert scaled.frontend == scaled_front_end(FRONT, 1.2)
    assert scaled.frontend_queue == scaled_queue(QUEUE, 1.2)
