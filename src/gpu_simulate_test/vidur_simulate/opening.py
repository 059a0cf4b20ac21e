"""A workload run and a profiling bundle opened as the simulator library's objects
(:func:`open_simulation`): the requests as arrays, the step model built once, the engine's spec;
what a caller then simulates in memory as often as it likes (:func:`~..simulator.api.simulate`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpu_simulate_test.config.schema import HardwareConfig, ModelConfig, OutputConfig
from gpu_simulate_test.config.vidur import (
    VidurConfig,
    VidurPredictorConfig,
    VidurSchedulerConfig,
    VidurSimulateStageConfig,
)
from gpu_simulate_test.simulator.api import EngineSpec, Workload
from gpu_simulate_test.simulator.step_model import StepModel
from gpu_simulate_test.simulator.types import NAME
from gpu_simulate_test.vidur_simulate.in_memory import workload_arrays
from gpu_simulate_test.vidur_simulate.prompt_origins import known_arrivals, prompt_segments
from gpu_simulate_test.vidur_simulate.replay import v1_params
from gpu_simulate_test.vidur_simulate.stage import prepare, step_model_of


@dataclass(frozen=True)
class Simulation:
    """What :func:`~..simulator.api.simulate` takes: the requests, the step model, the engine."""

    workload: Workload
    step_model: StepModel
    engine: EngineSpec


def open_simulation(
    workload_dir: Path | str,
    profiling_root: Path | str,
    model: ModelConfig,
    hardware: HardwareConfig,
    scheduler: VidurSchedulerConfig | None = None,
    work_dir: Path | str = "tmp/library",
    engine_overhead: str = "none",
) -> Simulation:
    """Open ``workload_dir`` (a ``workload`` run) on the bundle under ``profiling_root`` for
    ``model`` on ``hardware``, simulated with vLLM's V1 scheduler and ``scheduler``'s knobs
    (default: the project's), its steps timed by the bundle's profiled ops plus, with
    ``engine_overhead=<backend>``, that backend's calibration. Vidur's predictor is trained (or
    found) in ``work_dir``; the checks are the ``vidur_simulate`` stage's."""
    knobs = scheduler or VidurSchedulerConfig(name=NAME)
    if knobs.name != NAME:
        raise ValueError(f"the library simulates vllm_v1, not {knobs.name!r}")
    work = Path(work_dir)
    cfg = VidurSimulateStageConfig(
        model=model,
        hardware=hardware,
        workload_dir=str(workload_dir),
        profiling_root=str(profiling_root),
        vidur=VidurConfig(
            scheduler=knobs,
            predictor=VidurPredictorConfig(cache_dir=str(work / "predictor_cache")),
            engine_overhead=engine_overhead,
        ),
        output=OutputConfig(root=str(work)),
        progress=False,
    )
    inputs = prepare(cfg)
    step_model = step_model_of(cfg, inputs, work / "vidur")
    params = v1_params(knobs, inputs.kv_cache.num_blocks)
    assert step_model is not None and params is not None  # vllm_v1, no replay
    segments = prompt_segments(
        inputs.workload.lengths, inputs.prefill, inputs.workload.sessions, inputs.decode
    )
    arrival = known_arrivals(inputs.scheduler_arrival_s())
    workload = workload_arrays(inputs, arrival, segments)
    return Simulation(workload, step_model, EngineSpec(params))
