"""Our aggregate loop (``vidur.event_loop=fast`` with Vidur's schedulers): Vidur's decisions
batch for batch, many times faster (:func:`.event_loop.run_loop`), timed by Vidur's predictor.

It raises :class:`.loop_setup.NeedsVidurLoop` where it cannot follow; the hand-over to Vidur's
loop is :class:`.simulation.HandOver`'s, chosen with it in :func:`.simulation.simulator_for`.
"""

from __future__ import annotations

import time

from gpu_simulate_test.core.reporting import progress_bar
from gpu_simulate_test.vidur_simulate.simulator import (
    SimulationRequest,
    SimulationResult,
    build_predictor,
    clean_slate,
    fit_overhead,
    read_trace,
    steps_frame,
    write_raw,
)


class FastLoopSimulator:
    """A :class:`~.simulator.Simulator` on our event loop (one replica, one stage; sarathi,
    vllm and the fixed orca)."""

    def run(self, request: SimulationRequest) -> SimulationResult:
        from vidur.entities import Batch

        from gpu_simulate_test.vidur_simulate.event_loop import run_loop
        from gpu_simulate_test.vidur_simulate.loop_setup import batch_timer, params_from_scheduler

        start = clean_slate(request.seed)
        predictor, replica_scheduler = build_predictor(request.simulation_config)  # or loads
        params = params_from_scheduler(replica_scheduler)
        fitted = fit_overhead(predictor, request)
        report, table = fitted.report, fitted.table
        arrived_at, prefill_tokens, decode_tokens = read_trace(request.simulation_config)
        timer = batch_timer(predictor, fitted.overhead, fitted.draw, request.step_time_scale)
        built = time.perf_counter()
        label = f"simulating {len(arrived_at):,} requests"
        with progress_bar(label, len(arrived_at), request.progress) as advance:
            loop = run_loop(
                params,
                timer,
                arrived_at,
                prefill_tokens,
                decode_tokens,
                first_batch_id=Batch._id + 1,
                record_steps=request.step_log,
                progress=advance if request.progress else None,
            )
        Batch._id += loop.num_batches  # as if Vidur had numbered them
        done = time.perf_counter()
        steps = None
        if request.step_log:
            steps = steps_frame(
                loop.batch_ids,
                loop.batch_size,
                loop.batch_prefill_tokens,
                loop.batch_decode_tokens,
                loop.batch_time_s,
            )
        return SimulationResult(
            raw_metrics=write_raw(request.output_dir, loop.requests),
            predictor_setup_s=built - start,
            simulation_s=done - built,
            predictor_cache_hit=bool(predictor.cache_hit),
            engine_overhead=report,
            engine_overhead_fit=table,
            steps=steps,
            event_loop="fast",
        )
