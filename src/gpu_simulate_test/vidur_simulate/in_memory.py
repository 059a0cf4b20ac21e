"""``vllm_v1`` over checked inputs in memory, through the simulator library: no trace, no Vidur
config, no files (a capacity search's or a tune's rates)."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpu_simulate_test.config.fleet import FleetConfig
from gpu_simulate_test.config.vidur import VidurSimulateStageConfig
from gpu_simulate_test.simulator.api import EngineSpec, FleetSpec, Workload
from gpu_simulate_test.simulator.api import simulate as simulate_engine
from gpu_simulate_test.simulator.run import unsent_followers
from gpu_simulate_test.simulator.step_model import StepModel
from gpu_simulate_test.vidur_simulate import plan
from gpu_simulate_test.vidur_simulate.inputs import Inputs
from gpu_simulate_test.vidur_simulate.replay import v1_params
from gpu_simulate_test.vidur_simulate.simulator import SimulationResult
from gpu_simulate_test.vidur_simulate.simulator_v1 import v1_result


def fleet_spec(fleet: FleetConfig) -> FleetSpec | None:
    """The library's fleet for ``fleet.*`` (None: one engine)."""
    return (
        FleetSpec(fleet.replicas, fleet.router, fleet.poll_s, fleet.router_seed)
        if fleet.replicas > 1
        else None
    )


def workload_arrays(inputs: Inputs, arrival_s: np.ndarray, segments: Any) -> Workload:
    """The requests as the simulator takes them: token counts as Vidur's trace reader gives
    them, a closed loop's later turns without an arrival (their sends are simulated)."""
    prompt, output = plan.vidur_token_counts(inputs.prefill, inputs.decode, inputs.max_tokens)
    arrived = unsent_followers(arrival_s, inputs.after)
    return Workload(arrived, prompt, output, segments, inputs.after, sent_s=inputs.sent_s)


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
    loop = simulate_engine(
        workload, model, spec, seed=cfg.vidur.seed, log_steps=cfg.vidur.step_log,
        fleet=fleet_spec(cfg.fleet),
    )  # fmt: skip
    done = time.perf_counter()
    return v1_result(loop, step_model, cfg.vidur.step_log, loop.requests, 0.0, done - started)
