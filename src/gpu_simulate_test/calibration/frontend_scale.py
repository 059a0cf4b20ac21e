"""The front end at another host speed: every calibrated front-end cost times a factor
(``vidur.frontend_time_scale``, issue 64).

On this project's CPU host the engine core, its API server and the client share two cores, so a
host that runs the engine's steps slower than its calibration runs the API server's intake and
streaming slower too: over twenty main jobs the real front end per request (client less engine
TTFT) moved with the truth's step level at an elasticity of 1.10 (the steps' own part, queued to
the first token, at 0.87). The simulation at a real run's own step level (``pipeline.at_level``,
the fidelity stage's) therefore scales the front end with the steps where the engine runs on the
host's CPU (:func:`follows_steps`); on a GPU the steps' level says nothing of the CPU's front
end, and it stays as calibrated.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from gpu_simulate_test.calibration.frontend_queue import FrontEndQueue
from gpu_simulate_test.calibration.overhead import FrontEnd

if TYPE_CHECKING:
    from gpu_simulate_test.config.vidur import VidurConfig

Buckets = tuple[tuple[int, tuple[float, ...]], ...]


def follows_steps(device: str) -> bool:
    """Whether the front end runs at the steps' speed: the engine on the host's CPU
    (``hardware.device``), where the API server and the client share its cores."""
    return device == "cpu"


def at_level(vidur: VidurConfig, device: str, ratio: float) -> tuple[VidurConfig, bool]:
    """``vidur`` at a host's measured step level ``ratio``: every step ``ratio`` times as long
    (``step_time_scale``) and, where the front end follows the steps on ``device``
    (:func:`follows_steps`), the front end too (``frontend_time_scale``); with whether it did.
    The one place the pipeline's, the fidelity stage's and the tune's at-level simulations
    decide their scales."""
    front_end = follows_steps(device)
    leveled = dataclasses.replace(
        vidur, step_time_scale=ratio, frontend_time_scale=ratio if front_end else 1.0
    )
    return leveled, front_end


def _times(values: tuple[float, ...], factor: float) -> tuple[float, ...]:
    return tuple(float(v) * factor for v in values)


def _buckets(buckets: Buckets, factor: float) -> Buckets:
    return tuple((bucket, _times(levels, factor)) for bucket, levels in buckets)


def scaled_front_end(front: FrontEnd | None, factor: float) -> FrontEnd | None:
    """``front`` with every time ``factor`` times as long: the input line and its growth with
    load, the quiet and idle ways in, the output, and the spreads around the line (a hop as far
    above its line at the slower host as the calibration's was, times the factor); the most
    requests in flight the line holds at stays."""
    if front is None or factor == 1.0:
        return front

    def optional(value: float | None) -> float | None:
        return None if value is None else value * factor

    return dataclasses.replace(
        front,
        input_ms=front.input_ms * factor,
        output_ms=front.output_ms * factor,
        input_per_running_ms=front.input_per_running_ms * factor,
        quiet_input_ms=optional(front.quiet_input_ms),
        input_idle_ms=optional(front.input_idle_ms),
        input_residual_ms=_buckets(front.input_residual_ms, factor),
        busy_hop_residual_ms=_buckets(front.busy_hop_residual_ms, factor),
    )


def scaled_queue(queue: FrontEndQueue | None, factor: float) -> FrontEndQueue | None:
    """``queue`` (the API server as one worker) with every cost and spread ``factor`` times as
    long."""
    if queue is None or factor == 1.0:
        return queue
    return dataclasses.replace(
        queue,
        request_ms=queue.request_ms * factor,
        step_ms=queue.step_ms * factor,
        token_ms=queue.token_ms * factor,
        first_ms=queue.first_ms * factor,
        first_idle_residual_ms=_times(queue.first_idle_residual_ms, factor),
        first_busy_residual_ms=_buckets(queue.first_busy_residual_ms, factor),
    )
