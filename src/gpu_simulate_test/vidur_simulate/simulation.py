"""Run one Vidur simulation: the loop for a request, chosen in one place (:func:`simulator_for`).

Three loops share one interface (:class:`~.simulator.Simulator`: a frozen
:class:`~.simulator.SimulationRequest` in, a :class:`~.simulator.SimulationResult` out):

===================================  ==========================================================
``vidur.scheduler.name=vllm_v1``     :class:`~.simulator_v1.VllmV1Simulator` (our loop only:
                                     Vidur has none; ``event_loop=vidur`` is refused)
``vidur.event_loop=vidur``           :class:`~.simulator_vidur.VidurSimulator` (the reference)
``vidur.event_loop=fast`` (default)  :class:`~.simulator_fast.FastLoopSimulator`, handing over to
                                     Vidur's loop with the lean store whenever it cannot follow
                                     (:func:`.loop_setup.unsupported_reason`, or KV-cache
                                     preemption found on the way: :class:`HandOver`), which the
                                     result records
===================================  ==========================================================
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.vidur import EVENT_LOOPS
from gpu_simulate_test.vidur_simulate.loop_setup import (
    KvCacheExhausted,
    NeedsVidurLoop,
    unsupported_reason,
)
from gpu_simulate_test.vidur_simulate.simulator import (
    SimulationRequest,
    SimulationResult,
    Simulator,
)
from gpu_simulate_test.vidur_simulate.simulator_fast import FastLoopSimulator
from gpu_simulate_test.vidur_simulate.simulator_v1 import VllmV1Simulator
from gpu_simulate_test.vidur_simulate.simulator_vidur import VidurSimulator

__all__ = ("HandOver", "simulate", "simulator_for")


def simulate(request: SimulationRequest) -> SimulationResult:
    """Run ``request`` from a clean slate (entity ids, seeds) on its loop and read Vidur's
    request rows (also written to its output dir as ``request_metrics.csv``)."""
    return simulator_for(request).run(request)


def simulator_for(request: SimulationRequest) -> Simulator:
    """The loop that runs ``request``, by scheduler and ``event_loop`` (the table above);
    ConfigError for a pair that cannot run (vLLM's V1 scheduler on Vidur's loop)."""
    if request.v1 is not None:
        if request.event_loop != "fast":
            raise ConfigError(
                "vidur.scheduler.name=vllm_v1 runs in our event loop only (Vidur has no vLLM V1 "
                f"scheduler): leave vidur.event_loop={request.event_loop} out"
            )
        return VllmV1Simulator()
    if request.event_loop not in EVENT_LOOPS:
        raise ValueError(f"event_loop must be one of {EVENT_LOOPS}, got {request.event_loop!r}")
    if request.event_loop == "vidur":
        return VidurSimulator()
    reason = unsupported_reason(request.simulation_config)
    if reason is not None:
        return VidurSimulator(note=f"Vidur's loop ran: our loop does not simulate {reason}")
    return HandOver()


@dataclass(frozen=True)
class HandOver:
    """Our loop, handing over to Vidur's (with the lean store) the moment it reaches a state it
    does not reproduce (:class:`.loop_setup.NeedsVidurLoop`); the result says why. KV-cache
    preemption, which Vidur 0.0.26 then fails to simulate, is one clear ConfigError."""

    def run(self, request: SimulationRequest) -> SimulationResult:
        try:
            return FastLoopSimulator().run(request)
        except NeedsVidurLoop as exc:
            note = f"Vidur's loop ran: {exc}"
            exhausted = exc if isinstance(exc, KvCacheExhausted) else None
        try:
            result = VidurSimulator().run(request)
        except AssertionError as exc:
            if exhausted is None:
                raise
            raise ConfigError(
                f"vidur.scheduler.num_blocks: the KV cache runs out ({exhausted}), so requests "
                "would be preempted and restarted, which Vidur 0.0.26 fails to simulate (an "
                "assertion in its Request); give the cache more blocks "
                "(vidur.scheduler.num_blocks, 0 sizes it from device memory) or lower "
                "vidur.scheduler.batch_size_cap"
            ) from exc
        return replace(result, event_loop_note=note)
