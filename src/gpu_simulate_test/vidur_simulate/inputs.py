"""What a simulation is given, checked before it starts (:func:`.stage.prepare`), and the front
end's load at each send."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import overhead
from gpu_simulate_test.calibration.frontend_queue import FrontEndQueue
from gpu_simulate_test.calibration.frontend_scale import scaled_front_end, scaled_queue
from gpu_simulate_test.calibration.input_spread import (
    BUSY_HOP_STREAM,
    FIRST_SPREAD_STREAM,
    spread_levels,
)
from gpu_simulate_test.calibration.input_spread import spread_s as input_spread_s
from gpu_simulate_test.calibration.intake_phase import CLIENT_SEND_OFFSETS
from gpu_simulate_test.calibration.record import CalibrationRecord
from gpu_simulate_test.calibration.serving_load import CLIENT_SENDS
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.vidur import VidurSimulateStageConfig
from gpu_simulate_test.core.profiling.bundle import Bundle
from gpu_simulate_test.core.traffic.workloads import LoadedWorkload
from gpu_simulate_test.simulator.run import unsent_followers
from gpu_simulate_test.simulator.types import ENGINE
from gpu_simulate_test.simulator.types import NAME as V1_NAME
from gpu_simulate_test.vidur_simulate import metrics as vidur_metrics
from gpu_simulate_test.vidur_simulate import plan
from gpu_simulate_test.vidur_simulate.prompt_origins import session_loop
from gpu_simulate_test.vidur_simulate.replay import ReplaySource


@dataclass(frozen=True)
class Inputs:
    """Everything checked before the run starts."""

    workload: LoadedWorkload
    bundle: Bundle
    prefill: np.ndarray
    decode: np.ndarray
    arrival_time_s: np.ndarray
    needs: plan.Requirements
    kv_cache: plan.KvCachePlan
    bounds: dict[str, int]
    max_tokens: int
    engine_steps: pd.DataFrame | None = None
    """The bundle's calibration rows of ``vidur.engine_overhead`` (None: no overhead)."""
    step_jitter: overhead.StepJitter | None = None
    """The calibrated spread of single steps (``vidur.step_jitter``; None: off)."""
    frontend: overhead.FrontEnd | None = None
    """The front end's latency (``vidur.frontend_latency``; None: not modelled)."""
    frontend_queue: FrontEndQueue | None = None
    """The tokens' way back as a queue (``vidur.frontend_queue``; None: ``frontend``'s
    constant ``output_ms``)."""
    replay: ReplaySource | None = None
    """An oracle replay (``step_times_from``): the real run's engine arrivals and step clock."""
    serving_steps: pd.DataFrame | None = None
    """The bundle's calibration replays of ``vidur.engine_overhead`` (``vidur.serving_load``;
    None: no serving terms)."""
    calibration: CalibrationRecord | None = None
    """The bundle's calibration of ``vidur.engine_overhead`` (None: none)."""
    after: list[tuple[int, float]] | None = None
    """Multi-turn sessions: the closed loop (:func:`.prompt_origins.closed_loop`; None: open)."""
    input_by_queue: bool = False
    """``vidur.frontend_input=queue``: a request's input is the quiet client's plus its wait in
    ``frontend_queue`` (else the line in the requests running at its send)."""
    input_spread_levels: np.ndarray | None = None
    """``vidur.frontend_input_spread``: per request, its seeded level in the measured spread
    around the input line, added after the requests are put in order (the measured hops carry
    the holdups behind slower ones already; None: on the line)."""
    input_spread_note: str = "off"
    """What ``run_meta.json`` says of the spread."""
    input_spread_idle_only: bool = False
    """``vidur.frontend_idle_spread`` alone: only a request sent to an idle engine is spread."""
    busy_hop_levels: np.ndarray | None = None
    """``vidur.frontend_busy_hop``: per request, its seeded level in the busy sends' measured
    hops around the line (``frontend.busy_hop_residual_ms``), drawn where it is sent to a busy
    engine, after the order like the input spread (None: on the line)."""
    busy_hop_note: str = "off"
    """What ``run_meta.json`` says of it."""
    first_spread_levels: np.ndarray | None = None
    """``vidur.frontend_idle_spread`` or ``vidur.frontend_busy_spread``: per request, its
    seeded level in the measured spread of its first token's way back around the queue's (None:
    the queue's)."""
    first_spread_busy: bool = False
    """``vidur.frontend_busy_spread``: a request sent to a busy engine draws too (else only one
    sent to an idle engine does, with ``vidur.frontend_idle_spread``)."""
    first_spread_idle: bool = True
    """``vidur.frontend_idle_spread``: a request sent to an idle engine draws."""
    spread_tail: bool = False
    """``vidur.frontend_spread_tail``: every front-end spread read beyond its 99th percentile
    on an exponential tail (:func:`~..calibration.input_spread.read_quantiles`)."""

    def first_token_spread_s(self, running: np.ndarray) -> np.ndarray | float:
        """Per request, how much later than the queue says its first token reaches the client:
        its level read off the measured spread of the first tokens sent with as many requests in
        flight (``running``): an idle engine's (``first_idle_residual_ms``), a busy one's per
        bucket of requests in flight (``first_busy_residual_ms``), each where drawn, else 0
        (seconds; 0.0 without a spread)."""
        queue, levels, tail = self.frontend_queue, self.first_spread_levels, self.spread_tail
        if levels is None or queue is None:
            return 0.0
        running = np.asarray(running)
        out = np.zeros(len(running))
        if self.first_spread_idle and queue.first_idle_residual_ms:
            idle = ((0, queue.first_idle_residual_ms),)
            out = np.where(running == 0, input_spread_s(idle, levels, running, tail), out)
        if self.first_spread_busy and queue.first_busy_residual_ms:
            busy = input_spread_s(queue.first_busy_residual_ms, levels, running, tail)
            out = np.where(running > 0, busy, out)
        return out

    @property
    def sent_s(self) -> np.ndarray:
        """When the client sent each request, a closed loop's later turns NaN (their sends are
        simulated)."""
        return unsent_followers(self.arrival_time_s, self.after)

    def scheduler_arrival_s(
        self, running: np.ndarray | None = None, waits: np.ndarray | None = None
    ) -> np.ndarray:
        """When requests reach the simulated scheduler: sent, plus the front end's input for
        ``running`` requests in flight at each send (None: none) or, with
        :attr:`input_by_queue`, the quiet client's input plus each request's ``waits`` in the
        front end's queue (None: none), in the workload's order; in an oracle replay, when the
        real engine queued them."""
        if self.replay is not None:
            return self.replay.engine_arrival_s
        if self.frontend is None:
            return self.arrival_time_s
        if self.input_by_queue:
            quiet = self.frontend.quiet_input_ms
            base_s = (self.frontend.input_ms if quiet is None else quiet) / 1000.0
            reached = self.arrival_time_s + base_s + (0.0 if waits is None else waits)
        else:
            if running is None:
                running = np.zeros(len(self.arrival_time_s))
            reached = self.arrival_time_s + self.frontend.input_delays_s(running)
        known = ~np.isnan(reached)  # a closed-loop turn's send is the simulation's to find
        reached[known] = np.maximum.accumulate(reached[known])  # handed on in order
        levels = (self.input_spread_levels, self.busy_hop_levels)
        if self.input_by_queue or all(v is None for v in levels):
            return reached
        # the measured hops already carry the holdups behind slower requests: spread after the
        # order, never before the send (the every-send spread and the busy one never both drawn)
        assert running is not None
        at = np.asarray(running)
        spread = np.zeros(len(reached))
        if self.input_spread_levels is not None:
            spread = input_spread_s(
                self.frontend.input_residual_ms, self.input_spread_levels, running, self.spread_tail
            )
            if self.input_spread_idle_only:
                spread = np.where(at == 0, spread, 0.0)
        if self.busy_hop_levels is not None:
            hop = input_spread_s(
                self.frontend.busy_hop_residual_ms, self.busy_hop_levels, running, self.spread_tail
            )
            spread = spread + np.where(at > 0, hop, 0.0)
        return np.maximum(reached + spread, self.arrival_time_s)


def first_requests(inputs: Inputs, count: int) -> Inputs:
    """``inputs`` with only the workload's first ``count`` requests (what a real run of the same
    workload regenerated with ``count`` requests replays: the workload stage draws requests in
    order); unchanged for ``count`` at or above the workload's size, for a multi-turn workload
    (a session's turns follow one another) and for an oracle replay (the run's own requests)."""
    if count < 1:
        raise ValueError(f"first_requests: count must be >= 1, got {count}")
    whole = count >= len(inputs.arrival_time_s)
    if whole or inputs.workload.sessions is not None or inputs.replay is not None:
        return inputs
    workload = dataclasses.replace(
        inputs.workload,
        lengths=inputs.workload.lengths.iloc[:count].reset_index(drop=True),
        intervals=inputs.workload.intervals.iloc[:count].reset_index(drop=True),
    )
    return dataclasses.replace(
        inputs,
        workload=workload,
        prefill=inputs.prefill[:count],
        decode=inputs.decode[:count],
        arrival_time_s=inputs.arrival_time_s[:count],
        input_spread_levels=(
            None if inputs.input_spread_levels is None else inputs.input_spread_levels[:count]
        ),
        first_spread_levels=(
            None if inputs.first_spread_levels is None else inputs.first_spread_levels[:count]
        ),
        busy_hop_levels=(
            None if inputs.busy_hop_levels is None else inputs.busy_hop_levels[:count]
        ),
    )


def running_at_send(
    arrival_s: np.ndarray,
    scheduler_arrival_s: np.ndarray,
    raw: pd.DataFrame,
    per_server: bool = False,
) -> np.ndarray:
    """How many other requests were in flight (reached the scheduler, not finished) when each
    request was sent, by a simulation's results (Vidur's rows, any order); ``per_server``: on
    the request's own engine only (a fleet of servers, each with its own API server).

    Counted by binary search over the sorted starts and ends (a request is in flight at ``t``
    when ``start <= t < end``), so a million requests take a sort, not a million scans."""
    rows = raw.sort_values(vidur_metrics.VIDUR_ID, kind="stable")
    start = np.asarray(scheduler_arrival_s, dtype=float)
    done = start + rows["request_e2e_time"].to_numpy(dtype=float)
    sent = np.asarray(arrival_s, dtype=float)
    if per_server and ENGINE in rows.columns:
        engines = rows[ENGINE].to_numpy()
        out = np.zeros(len(sent), dtype=int)
        for k in np.unique(engines):
            on = engines == k
            out[on] = _in_flight(start[on], done[on], sent[on])
        return out
    return _in_flight(start, done, sent)


def _in_flight(start: np.ndarray, done: np.ndarray, sent: np.ndarray) -> np.ndarray:
    started = np.searchsorted(np.sort(start), sent, side="right")
    ended = np.searchsorted(np.sort(done), sent, side="right")
    itself = (start <= sent) & (sent < done)
    return started - ended - itself.astype(int)


def serving_steps_of(steps: pd.DataFrame | None, intake: bool) -> pd.DataFrame | None:
    """The calibration replays' steps the serving terms are fitted on: without their sends
    where the intake is off (``vidur.serving_intake=false``: fitted as before version 12)."""
    if steps is None or intake or CLIENT_SENDS not in steps.columns:
        return steps
    return steps.drop(columns=[CLIENT_SENDS, CLIENT_SEND_OFFSETS], errors="ignore")


NO_FRONT_END = (
    "none: no front end's way in (vidur.engine_overhead=none, a calibration without one, "
    "vidur.frontend_latency off, or a replay)"
)
"""What ``run_meta.json`` says of a front-end spread where the simulation has no front end."""


def input_spread(
    frontend: overhead.FrontEnd | None,
    enabled: bool,
    by_queue: bool,
    count: int,
    seed: int,
    idle: bool = False,
) -> tuple[np.ndarray | None, str]:
    """``vidur.frontend_input_spread``'s (``enabled``) or ``vidur.frontend_idle_spread``'s
    (``idle``: the sends to an idle engine only) seeded levels for ``count`` requests, and what
    ``run_meta.json`` says of it (None: the way in stays on the line, and why)."""
    if not enabled and not idle:
        return None, "off"
    if frontend is None:
        return None, NO_FRONT_END
    if by_queue:
        return None, "none: it spreads the calibrated line (vidur.frontend_input=line)"
    buckets = dict(frontend.input_residual_ms)
    if not buckets:
        return None, "none: the calibration has no input_residual_ms (before version 12)"
    if not enabled and 0 not in buckets:
        return None, "none: the calibration's replays have too few sends to an idle engine"
    where = "" if enabled else ", the sends to an idle engine"
    return spread_levels(count, seed), f"drawn (seed {seed}{where})"


def busy_hop(
    frontend: overhead.FrontEnd | None,
    enabled: bool,
    by_queue: bool,
    spread_all: bool,
    count: int,
    seed: int,
    closed_loop: bool = False,
) -> tuple[np.ndarray | None, str]:
    """``vidur.frontend_busy_hop``'s seeded levels for ``count`` requests (a stream of their
    own) and what ``run_meta.json`` says of it (None: the busy sends' way in stays on the line,
    and why)."""
    if not enabled:
        return None, "off"
    if frontend is None:
        return None, NO_FRONT_END
    if by_queue:
        return None, "none: it spreads the calibrated line (vidur.frontend_input=line)"
    if closed_loop:
        return None, "none: a closed loop's way in is taken at its send, not by the load"
    if spread_all:
        return None, "none: vidur.frontend_input_spread spreads every send"
    if not frontend.busy_hop_residual_ms:
        return None, "none: the calibration has no busy_hop_residual_ms (before version 19)"
    return spread_levels(count, seed, BUSY_HOP_STREAM), f"drawn (seed {seed}, the busy sends)"


def first_spread(
    queue: FrontEndQueue | None, idle: bool, count: int, seed: int, busy: bool = False
) -> np.ndarray | None:
    """``vidur.frontend_idle_spread``'s (``idle``) or ``vidur.frontend_busy_spread``'s
    (``busy``) seeded levels for the first tokens' way back (a stream of their own), None where
    both are off or the calibration has neither spread (an idle engine's before version 16, a
    busy one's before 18)."""
    if queue is None:
        return None
    if not (idle and queue.first_idle_residual_ms) and not (busy and queue.first_busy_residual_ms):
        return None
    return spread_levels(count, seed, FIRST_SPREAD_STREAM)


class FrontEndInputs(TypedDict):
    """The front end's part of :class:`Inputs` (see there), as :func:`front_end_inputs` sets
    it up."""

    frontend: overhead.FrontEnd | None
    frontend_queue: FrontEndQueue | None
    after: list[tuple[int, float]] | None
    input_by_queue: bool
    input_spread_levels: np.ndarray | None
    input_spread_note: str
    input_spread_idle_only: bool
    busy_hop_levels: np.ndarray | None
    busy_hop_note: str
    first_spread_levels: np.ndarray | None
    first_spread_idle: bool
    first_spread_busy: bool
    spread_tail: bool


def front_end_inputs(
    cfg: VidurSimulateStageConfig,
    record: CalibrationRecord | None,
    workload: LoadedWorkload,
    replaying: bool,
    count: int,
) -> FrontEndInputs:
    """The front end a simulation of ``count`` requests takes from the calibration ``record``:
    its way in and out at ``vidur.frontend_time_scale`` (none in an oracle replay, which follows
    the real run's own arrivals), a multi-turn workload's closed loop, the API server's queue,
    and the seeded spreads the knobs draw; ConfigError where ``vidur.frontend_input=queue``
    cannot be had."""
    knobs, v1 = cfg.vidur, cfg.vidur.scheduler.name == V1_NAME
    frontend = None
    if record is not None and knobs.frontend_latency and not replaying:
        frontend = scaled_front_end(record.frontend, knobs.frontend_time_scale)
    after = session_loop(workload.sessions, knobs.scheduler.name, frontend, replaying)
    queue = None
    if frontend is not None and knobs.frontend_queue and v1:
        logged = record.frontend_queue if record is not None and knobs.step_log else None
        queue = scaled_queue(logged, knobs.frontend_time_scale)
    by_queue = knobs.frontend_input == "queue" and frontend is not None and after is None
    if by_queue and (queue is None or cfg.fleet.replicas > 1):
        raise ConfigError(
            "vidur.frontend_input=queue takes a request in through the front end's queue: it "
            "needs vidur.frontend_queue=true, vidur.step_log=true, vidur.scheduler.name=vllm_v1, "
            "one engine (fleet.replicas=1) and a calibration with frontend.queue; or set "
            "vidur.frontend_input=line"
        )
    spread_all, idle = knobs.frontend_input_spread, knobs.frontend_idle_spread
    levels, spread_note = input_spread(frontend, spread_all, by_queue, count, knobs.seed, idle)
    hop_levels, hop_note = busy_hop(
        frontend,
        knobs.frontend_busy_hop,
        by_queue,
        spread_all,
        count,
        knobs.seed,
        after is not None,
    )
    busy = knobs.frontend_busy_spread
    return FrontEndInputs(
        frontend=frontend,
        frontend_queue=queue,
        after=after,
        input_by_queue=by_queue,
        input_spread_levels=levels,
        input_spread_note=spread_note,
        input_spread_idle_only=idle and not spread_all,
        busy_hop_levels=hop_levels,
        busy_hop_note=hop_note,
        first_spread_levels=first_spread(queue, idle, count, knobs.seed, busy=busy),
        first_spread_idle=idle,
        first_spread_busy=busy,
        spread_tail=knobs.frontend_spread_tail,
    )
