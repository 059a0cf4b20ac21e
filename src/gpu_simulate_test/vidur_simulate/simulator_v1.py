"""vLLM's V1 scheduler (``vidur.scheduler.name=vllm_v1``), step by step (:func:`.vllm_v1.run_v1`),
over Vidur's trace reader: timed by Vidur's predictor, built and its overhead fitted as for
Vidur's schedulers, with the serving terms where calibrated (:class:`.predictor_clock.
PredictorClock`), or by a real run's own steps (an oracle replay's clock). Vidur has no such
scheduler, so it runs in our loop only.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.simulator.types import StepClock
from gpu_simulate_test.vidur_simulate.simulator import (
    SimulationRequest,
    SimulationResult,
    attach_overhead,
    build_predictor,
    clean_slate,
    read_trace,
    write_raw,
)

_SETUPS: dict[str, tuple[Any, ...]] = {}
"""The last simulation's predictor, with its fitted overhead and serving terms, by
:func:`setup_key`: a search simulates one configuration at many rates (and each rate in up to
:data:`~.stage.FRONTEND_PASSES` passes), and none of these depend on the arrivals; rebuilding them
took about half of each 400-request simulation."""


def forget_setups() -> None:
    """Drop the held setup (the next simulation builds its own)."""
    _SETUPS.clear()


def held_step_model() -> tuple[Any, Any] | None:
    """The last simulation's step model: its :class:`~.loop_setup.BatchTimer` and serving terms
    (:class:`~..calibration.serving_load.ServingLoad`, None without them); None when no
    predictor-timed simulation is held."""
    held = next(iter(_SETUPS.values()), None)
    return None if held is None else (held[5], held[6])


def setup_key(request: SimulationRequest) -> str | None:
    """What the predictor and its fits depend on: the cluster and predictor configs (the bundle,
    the model, the scheduler's bounds), the overhead's backend and seed (the engine's and the
    serving steps are compared by identity beside it); None (never reused) with step jitter,
    whose draws the predictor carries from run to run."""
    if request.step_jitter is not None:
        return None
    config = request.simulation_config
    return repr(
        (
            config.cluster_config,
            config.execution_time_predictor_config,
            request.backend,
            request.seed,
        )
    )


class VllmV1Simulator:
    """A :class:`~.simulator.Simulator` on vLLM's V1 scheduler (``request.v1``)."""

    def run(self, request: SimulationRequest) -> SimulationResult:
        from gpu_simulate_test.core.engines.step_record import step_log_rows
        from gpu_simulate_test.simulator.run import run_v1
        from gpu_simulate_test.vidur_simulate.loop_setup import BatchTimer, unsupported_reason
        from gpu_simulate_test.vidur_simulate.predictor_clock import PredictorClock, fit_serving

        if request.v1 is None:
            raise ValueError("VllmV1Simulator needs the request's v1 (vLLM's scheduler knobs)")
        config = request.simulation_config
        reason = unsupported_reason(config)
        if reason is not None:
            raise ConfigError(f"vidur.scheduler.name=vllm_v1 simulates one engine, not {reason}")
        start = clean_slate(request.seed)
        report = table = None
        serving_fit = None
        cache_hit = False
        clock: StepClock
        if request.replay_clock is None:
            key = setup_key(request)
            held = _SETUPS.get(key) if key is not None else None
            if (
                held is None
                or held[0] is not request.engine_steps
                or held[1] is not request.serving_steps
            ):
                predictor, _ = build_predictor(config)  # trains or loads
                report, table = attach_overhead(predictor, request)
                timer = BatchTimer(predictor)
                load = None
                if request.serving_steps is not None and report is not None:
                    load, features, predicted = fit_serving(timer, request.serving_steps)
                    serving_fit = (load, features, predicted)
                held = (request.engine_steps, request.serving_steps, predictor, report, table,
                        timer, load, serving_fit)  # fmt: skip
                if key is not None:
                    _SETUPS.clear()  # one simulation config at a time: a search's rates
                    _SETUPS[key] = held
            _, _, predictor, report, table, timer, load, serving_fit = held
            clock = PredictorClock(timer, load, request.seed, request.step_time_scale)
            cache_hit = bool(predictor.cache_hit)
        else:
            clock = request.replay_clock
        arrived_at, prefill_tokens, decode_tokens = read_trace(config)
        if request.after is not None:
            arrived_at = arrived_at.astype(float)
            arrived_at[[nxt for nxt, _ in request.after if nxt >= 0]] = np.nan
        built = time.perf_counter()
        loop = run_v1(
            request.v1, clock, arrived_at, prefill_tokens, decode_tokens,
            segments=request.prompt_segments, after=request.after,
        )  # fmt: skip
        done = time.perf_counter()
        schedule = loop.schedule
        return SimulationResult(
            raw_metrics=write_raw(request.output_dir, loop.requests),
            predictor_setup_s=built - start,
            simulation_s=done - built,
            predictor_cache_hit=cache_hit,
            engine_overhead=report,
            engine_overhead_fit=table,
            steps=step_log_rows(schedule, timed=False) if request.step_log else None,
            event_loop="fast",
            schedule=schedule if request.step_log else None,
            preemptions=loop.preemptions,
            oracle=request.replay_clock.report() if request.replay_clock is not None else None,
            serving_fit=serving_fit,
            prefix_cache=loop.prefix_cache,
        )
