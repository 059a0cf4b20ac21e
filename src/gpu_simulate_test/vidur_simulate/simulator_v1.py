"""vLLM's V1 scheduler (``vidur.scheduler.name=vllm_v1``), step by step (:func:`~..simulator.run.
run_v1`), over Vidur's trace reader: timed by a :class:`~..simulator.step_model.StepModel` (Vidur's
predictor with the engine overhead fitted as for Vidur's schedulers, and the serving terms where
calibrated), handed in by the caller or built here, or by a real run's own steps (an oracle
replay's clock). Vidur has no such scheduler, so it runs in our loop only.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pandas as pd

from gpu_simulate_test.calibration.serving_load import ServingLoad
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.simulator.api import EngineSpec, Workload, simulate
from gpu_simulate_test.simulator.run import V1Result, run_v1, unsent_followers
from gpu_simulate_test.simulator.step_model import StepModel
from gpu_simulate_test.simulator.types import StepClock
from gpu_simulate_test.vidur_simulate.simulator import (
    FleetReplayClock,
    SimulationRequest,
    SimulationResult,
    build_predictor,
    clean_slate,
    fit_overhead,
    read_trace,
    write_raw,
)


def build_step_model(request: SimulationRequest) -> StepModel:
    """The step model of ``request``'s bundle and calibration: Vidur's predictor (trained or
    loaded), the engine overhead fitted against it and the serving terms; at level 1 (a
    simulation applies its ``step_time_scale``)."""
    from gpu_simulate_test.simulator.step_model import fit_serving
    from gpu_simulate_test.vidur_simulate.loop_setup import batch_timer

    predictor, _ = build_predictor(request.simulation_config)  # trains or loads
    fitted = fit_overhead(predictor, request)
    timer = batch_timer(predictor, fitted.overhead)
    serving_fit = None
    if request.serving_steps is not None and fitted.report is not None:
        serving_fit = fit_serving(timer, request.serving_steps, request.intake_step)
    serving = serving_fit[0] if serving_fit is not None else None
    if serving is not None:
        serving = as_set(serving, request.wake_spread, request.busy_spread, request.intake_pause)
    return StepModel(
        timer,
        serving=serving,
        jitter=request.step_jitter if fitted.overhead is not None else None,
        overhead_report=fitted.report,
        overhead_fit=fitted.table,
        serving_fit=serving_fit,
        cache_hit=bool(predictor.cache_hit),
        intake_catch=request.intake_catch,
    )


def as_set(
    serving: ServingLoad, wake_spread: bool, busy_spread: bool, intake_pause: bool
) -> ServingLoad:
    """The fitted serving terms as the simulation's knobs set them: without ``wake_spread``
    each wake-up on the curve, without ``busy_spread`` the lognormal noise, without
    ``intake_pause`` one mean pause before every busy step."""
    if not wake_spread:
        serving = dataclasses.replace(serving, wake_residual_ms=())
    if not busy_spread:
        serving = dataclasses.replace(serving, busy_residual=())
    return serving if intake_pause else serving.without_intake_pause()


class VllmV1Simulator:
    """A :class:`~.simulator.Simulator` on vLLM's V1 scheduler (``request.v1``)."""

    def run(self, request: SimulationRequest) -> SimulationResult:
        from gpu_simulate_test.vidur_simulate.loop_setup import unsupported_reason

        if request.v1 is None:
            raise ValueError("VllmV1Simulator needs the request's v1 (vLLM's scheduler knobs)")
        config = request.simulation_config
        reason = unsupported_reason(config)
        if reason is not None:
            raise ConfigError(f"vidur.scheduler.name=vllm_v1 simulates one engine, not {reason}")
        start = clean_slate(request.seed)
        model = None
        replay = request.replay_clock
        fleet = request.fleet is not None and request.fleet.replicas > 1
        fleet_replay = replay if isinstance(replay, FleetReplayClock) else None
        if replay is None:
            model = request.step_model or build_step_model(request)
        elif fleet != (fleet_replay is not None):
            raise ConfigError(
                "an oracle replay of a data-parallel run simulates as many engines as it ran "
                "(fleet.replicas), and one engine's run one engine"
            )
        arrived_at, prefill_tokens, decode_tokens = read_trace(config)
        if request.after is not None:
            arrived_at = unsent_followers(arrived_at, request.after)
        built = time.perf_counter()
        if fleet:
            workload = Workload(
                arrived_at, prefill_tokens, decode_tokens, request.prompt_segments,
                request.after, fleet_replay.routed_at if fleet_replay is not None else None,
                fleet_replay.router_reads if fleet_replay is not None else None,
                request.sent_s,
            )  # fmt: skip
            if fleet_replay is not None:  # an oracle replay: a clock per engine
                timing: StepModel | list[StepClock] = list(fleet_replay.clocks)
            else:
                assert model is not None
                timing = model.at_level(request.step_time_scale)
            loop = simulate(
                workload, timing, EngineSpec(request.v1), seed=request.seed,
                log_steps=request.step_log, fleet=request.fleet,
            )  # fmt: skip
        else:
            clock: StepClock = (
                model.at_level(request.step_time_scale).clock(
                    request.seed, request.sent_s, arrivals=arrived_at
                )
                if model is not None
                else replay  # type: ignore[assignment]
            )
            loop = run_v1(
                request.v1, clock, arrived_at, prefill_tokens, decode_tokens,
                segments=request.prompt_segments, after=request.after,
                log_steps=request.step_log,
            )  # fmt: skip
        done = time.perf_counter()
        return v1_result(
            loop,
            model,
            request.step_log,
            write_raw(request.output_dir, loop.requests),
            built - start,
            done - built,
            replay.report() if replay is not None else None,
        )


def v1_result(
    loop: V1Result,
    model: StepModel | None,
    step_log: bool,
    raw_metrics: pd.DataFrame,
    setup_s: float,
    simulation_s: float,
    oracle: dict[str, Any] | None = None,
) -> SimulationResult:
    """A ``vllm_v1`` simulation's result, whether its files were written or it ran in memory:
    the step model's fits (None: an oracle replay's clock), the steps when logged."""
    from gpu_simulate_test.core.engines.step_record import step_log_rows

    return SimulationResult(
        raw_metrics=raw_metrics,
        predictor_setup_s=setup_s,
        simulation_s=simulation_s,
        predictor_cache_hit=model is not None and model.cache_hit,
        engine_overhead=model.overhead_report if model is not None else None,
        engine_overhead_fit=model.overhead_fit if model is not None else None,
        steps=step_log_rows(loop.schedule, timed=False) if step_log else None,
        event_loop="fast",
        schedule=loop.schedule if step_log else None,
        preemptions=loop.preemptions,
        oracle=oracle,
        serving_fit=model.serving_fit if model is not None else None,
        prefix_cache=loop.prefix_cache,
    )
