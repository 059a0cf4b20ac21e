"""``vllm_v1`` over checked inputs in memory, through the simulator library: no trace, no Vidur
config, no files (a capacity search's or a tune's rates)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpu_simulate_test.config.vidur import VidurSimulateStageConfig
from gpu_simulate_test.simulator.api import EngineSpec, Workload
from gpu_simulate_test.simulator.api import simulate as simulate_engine
from gpu_simulate_test.simulator.step_model import StepModel
from gpu_simulate_test.vidur_simulate import plan
from gpu_simulate_test.vidur_simulate.inputs import Inputs
from gpu_simulate_test.vidur_simulate.replay import v1_params
from gpu_simulate_test.vidur_simulate.simulator import SimulationResult


def workload_arrays(inputs: Inputs, arrival_s: np.ndarray, segments: Any) -> Workload:
    """The requests as the simulator takes them: token counts as Vidur's trace reader gives
    them, a closed loop's later turns without an arrival (their sends are simulated)."""
    prompt, output = plan.vidur_token_counts(inputs.prefill, inputs.decode, inputs.max_tokens)
    arrived = np.array(arrival_s, dtype=float)
    if inputs.after is not None:
        arrived[[nxt for nxt, _ in inputs.after if nxt >= 0]] = np.nan
    return Workload(arrived, prompt, output, segments, inputs.after)


def simulate_v1(
    cfg: VidurSimulateStageConfig,
    inputs: Inputs,
    arrival_s: np.ndarray,
    segments: Any,
    step_model: StepModel,
) -> SimulationResult:
    """``vllm_v1`` in memory (:func:`~..simulator.api.simulate`): the trace's arrays as Vidur's
    trace reader would give them, no file written."""
    workload = workload_arrays(inputs, arrival_s, segments)
    model = step_model.at_level(cfg.vidur.step_time_scale)
    params = v1_params(cfg.vidur.scheduler, inputs.kv_cache.num_blocks)
    if params is None:
        raise ValueError(f"in memory simulates vllm_v1, not {cfg.vidur.scheduler.name}")
    spec = EngineSpec(params)
    started = time.perf_counter()
    loop = simulate_engine(workload, model, spec, seed=cfg.vidur.seed, log_steps=cfg.vidur.step_log)
    steps = None
    if cfg.vidur.step_log:
        from gpu_simulate_test.core.engines.step_record import step_log_rows

        steps = step_log_rows(loop.schedule, timed=False)
    return SimulationResult(
        raw_metrics=loop.requests,
        predictor_setup_s=0.0,
        simulation_s=time.perf_counter() - started,
        predictor_cache_hit=step_model.cache_hit,
        engine_overhead=step_model.overhead_report,
        engine_overhead_fit=step_model.overhead_fit,
        steps=steps,
        event_loop="fast",
        schedule=loop.schedule if cfg.vidur.step_log else None,
        preemptions=loop.preemptions,
        serving_fit=step_model.serving_fit,
        prefix_cache=loop.prefix_cache,
        step_model=step_model,
    )
