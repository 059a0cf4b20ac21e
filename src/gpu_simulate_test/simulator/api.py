"""Simulate in memory: a workload's arrays in, a table out, no files (:func:`simulate`).

The engine is named by its scheduler in :data:`~.registry.ENGINES`; its steps are timed by a
:class:`~.step_model.StepModel` built once and handed to every simulation (a capacity search's
rates, a tune's configurations).
"""

from __future__ import annotations

import contextlib
import math
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from numpy.typing import ArrayLike

from gpu_simulate_test.simulator.kv_cache import Segments
from gpu_simulate_test.simulator.registry import ENGINES, EngineRegistry
from gpu_simulate_test.simulator.run import V1Result
from gpu_simulate_test.simulator.step_model import PredictorClock, StepModel
from gpu_simulate_test.simulator.types import StepClock, V1Params, is_count


@dataclass(frozen=True)
class Workload:
    """Requests as arrays, row ``i`` request ``i``."""

    arrival_s: np.ndarray
    """When each request reaches the engine (NaN: a closed loop's later turn, sent by ``after``)."""
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    segments: Sequence[Segments] | None = None
    """What each prompt is made of, for prefix caching (None: every prompt its own)."""
    after: Sequence[tuple[int, float]] | None = None
    """A closed loop: per request, the request sent when it finishes (-1: none) and the think
    time in seconds."""
    routed_at: np.ndarray | None = None
    """A fleet: when the router decides for each request, at or before its arrival at the
    engine (an oracle replay: when the client sent it; None: at its arrival); a time >= 0
    for every request with an arrival (a closed loop's later turn is routed when it is sent)."""
    router_reads: Sequence[list[tuple[int, float]] | None] | None = None
    """A fleet's oracle replay: per request, the (waiting, KV usage) of each engine that the real
    client's router read when it routed it; a router that reads the engines' load reads these
    instead of the simulated engines' (None: the simulated engines', as for a request without)."""
    sent_s: np.ndarray | None = None
    """When the client sent each request (NaN: a closed loop's later turn): a step model with a
    calibrated intake (:class:`~.step_model.StepModel`) adds each send's intake to the step it
    falls in, a fleet's replica its share (None: no intake)."""

    def __post_init__(self) -> None:
        check_workload(self)

    @classmethod
    def of(
        cls, arrival_s: ArrayLike, prompt_tokens: ArrayLike, output_tokens: ArrayLike
    ) -> Workload:
        """Requests from any arrays or sequences: arrivals in seconds, tokens (whole numbers)."""
        tokens = [np.asarray(t) for t in (prompt_tokens, output_tokens)]
        for name, values in zip(("prompt_tokens", "output_tokens"), tokens, strict=True):
            _whole(name, values)
        prompt, output = (t.astype(np.int64) for t in tokens)
        return cls(np.asarray(arrival_s, dtype=float), prompt, output)


def _whole(name: str, values: np.ndarray) -> None:
    """Fail unless ``values`` are whole numbers (a float count is not truncated in silence)."""
    if values.dtype.kind in "iu":
        return
    flat = values.ravel()
    if values.dtype.kind == "b":  # True is not a count
        first: int | None = 0 if flat.size else None
    elif values.dtype.kind == "f":
        number = flat.astype(float)
        bad = np.flatnonzero(~(np.isfinite(number) & (number == np.floor(number))))
        first = int(bad[0]) if bad.size else None
    else:  # objects, strings: one at a time
        first = next((i for i, v in enumerate(flat) if not _is_whole(v)), None)
    if first is not None:
        value = flat[first]
        said = repr(value.item() if isinstance(value, np.generic) else value)
        raise ValueError(f"Workload.{name}[{first}] is {said}, expected a whole number of tokens")


def _is_whole(value: object) -> bool:
    if isinstance(value, bool | np.bool_):
        return False
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return False
    return bool(np.isfinite(number) and number == int(number))


def check_workload(workload: Workload) -> None:
    """Fail, naming the field, on arrays no simulation can read: of different lengths or not
    1-D, arrivals negative or infinite (NaN only for a closed loop's later turns, sent by
    ``after``), token counts that are not whole numbers >= 1, routing times that are not
    times."""
    if np.ndim(workload.arrival_s) != 1:
        raise ValueError(
            f"Workload.arrival_s has shape {np.shape(workload.arrival_s)}, expected a 1-D array "
            "(one arrival a request)"
        )
    n = len(workload.arrival_s)
    for name in ("prompt_tokens", "output_tokens", "routed_at", "sent_s"):
        values = getattr(workload, name)
        if values is not None and (np.ndim(values) != 1 or len(values) != n):
            raise ValueError(
                f"Workload.{name} has shape {np.shape(values)}, expected one value a request "
                f"({n}, as arrival_s)"
            )
    for name in ("segments", "after", "router_reads"):
        values = getattr(workload, name)
        if values is not None and len(values) != n:
            raise ValueError(
                f"Workload.{name} has {len(values)} entries, expected {n} (one a request)"
            )
    for name in ("prompt_tokens", "output_tokens"):
        tokens = np.asarray(getattr(workload, name))
        _whole(name, tokens)
        few = np.flatnonzero(tokens < 1)
        if few.size:
            i = int(few[0])
            raise ValueError(
                f"Workload.{name}[{i}] is {tokens[i]}, expected a whole number of tokens >= 1 "
                "(every request has a prompt and makes an output)"
            )
    arrivals = np.asarray(workload.arrival_s, dtype=float)
    bad = np.flatnonzero(
        np.isinf(arrivals) | (arrivals < 0) | (np.isnan(arrivals) & (workload.after is None))
    )
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"Workload.arrival_s[{i}] is {arrivals[i]}, expected a time in seconds >= 0 (NaN only "
            "for a closed loop's later turn, with after)"
        )
    _check_routed_at(workload.routed_at, arrivals)


def _check_routed_at(routed_at: np.ndarray | None, arrivals: np.ndarray) -> None:
    """Fail unless the router decides for every request with an arrival at a time in seconds
    >= 0 (a NaN would drop it from the fleet; a closed loop's later turn is routed when it is
    sent, whatever it holds; a time past the arrival is read as the arrival)."""
    if routed_at is None:
        return
    try:
        decide = np.asarray(routed_at, dtype=float)
    except (TypeError, ValueError):
        raise ValueError("Workload.routed_at holds values that are not times in seconds") from None
    bad = np.flatnonzero(~np.isnan(arrivals) & ~(np.isfinite(decide) & (decide >= 0)))
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"Workload.routed_at[{i}] is {decide[i]}, expected a time in seconds >= 0 (when the "
            "router decides, at or before the request's arrival)"
        )


@dataclass(frozen=True)
class FleetSpec:
    """Replicas of one engine behind a router (:mod:`.fleet`; a name in
    :data:`~.routers.ROUTERS`)."""

    replicas: int = 1
    router: str = "vllm_dp"
    poll_s: float = 0.05
    """How often a router that reads the engines' load scrapes it (``prefix_affinity``; llm-d's
    50 ms); 0: it reads them live."""
    router_seed: int = 0
    """The seed of the router's draws (``random``, ``prefix_affinity``'s ties): the real
    client's (:data:`~gpu_simulate_test.core.routing.ROUTER_SEED`) by default."""

    def __post_init__(self) -> None:
        from gpu_simulate_test.simulator.routers import ROUTERS

        if not is_count(self.replicas):
            raise ValueError(f"fleet.replicas must be a whole number, got {self.replicas!r}")
        if self.replicas < 1:
            raise ValueError(f"fleet.replicas must be at least 1, got {self.replicas}")
        if self.router not in ROUTERS:
            raise ValueError(f"fleet.router must be one of {sorted(ROUTERS)}, got {self.router!r}")
        poll = self.poll_s
        if not (
            isinstance(poll, int | float | np.integer | np.floating)
            and not isinstance(poll, bool)
            and math.isfinite(poll)
            and poll >= 0
        ):
            raise ValueError(
                f"fleet.poll_s is {poll!r}, expected a finite number of seconds >= 0 (0: live)"
            )
        if not is_count(self.router_seed) or self.router_seed < 0:
            raise ValueError(
                f"fleet.router_seed is {self.router_seed!r}, expected a whole number >= 0"
            )


@dataclass(frozen=True)
class EngineSpec:
    """One engine: its scheduler (a name in :data:`~.registry.ENGINES`) and vLLM's knobs."""

    params: V1Params
    scheduler: str = "vllm_v1"

    def __post_init__(self) -> None:
        if not isinstance(self.params, V1Params):
            raise ValueError(
                f"EngineSpec.params is a {type(self.params).__name__}, expected V1Params (vLLM's "
                "knobs, checked as it is made)"
            )
        if not isinstance(self.scheduler, str) or not self.scheduler:
            raise ValueError(
                f"EngineSpec.scheduler is {self.scheduler!r}, expected an engine's name (one of "
                f"{', '.join(ENGINES.names())}, or one registered with ENGINES.with_engine)"
            )


def simulate(
    workload: Workload,
    step_model: StepModel | StepClock | Sequence[StepClock],
    engine: EngineSpec,
    seed: int = 0,
    engines: EngineRegistry = ENGINES,
    log_steps: bool = True,
    fleet: FleetSpec | None = None,
) -> V1Result:
    """Simulate ``workload`` on one engine, its steps timed by ``step_model`` (or a ready
    clock, e.g. an oracle replay's), with the seed of its draws; the per-request rows (Vidur's
    columns), the schedule (empty with ``log_steps=False``) and the totals, in memory.

    With a ``fleet`` of more than one replica: that many engines (``vllm_v1``), engine ``k``
    timed by ``step_model.clock(seed + k)`` (or by the ``k``-th of a sequence of clocks, one
    per replica: an oracle replay of a data-parallel run), behind the fleet's router; both
    tables carry an ``engine`` column. One engine takes one clock, alone or in a sequence.

    A ready clock from a step model (``step_model.clock(seed, ...)``) times one run of one
    engine: its serving window and draws go on from where that run left them, so a second run
    with it is refused (a ValueError); make a clock per run, or hand the step model itself."""
    with _covered(step_model):
        if fleet is not None and fleet.replicas > 1:
            return _simulate_fleet(workload, step_model, engine, seed, fleet, log_steps)
        return _simulate_one(workload, step_model, engine, seed, engines, log_steps)


def _simulate_one(
    workload: Workload,
    step_model: StepModel | StepClock | Sequence[StepClock],
    engine: EngineSpec,
    seed: int,
    engines: EngineRegistry,
    log_steps: bool,
) -> V1Result:
    """:func:`simulate` on one engine."""
    if isinstance(step_model, Sequence):
        if len(step_model) != 1:
            raise ValueError(
                f"{len(step_model)} clocks for one engine: a clock per engine times a fleet of "
                f"that many, pass fleet=FleetSpec({len(step_model)}) (or one clock)"
            )
        step_model = step_model[0]  # one replica's clock
    clock = (
        step_model.clock(seed, workload.sent_s, arrivals=workload.arrival_s)
        if isinstance(step_model, StepModel)
        else step_model
    )
    run = engines.get(engine.scheduler)
    return run(
        engine.params,
        clock,
        workload.arrival_s,
        workload.prompt_tokens,
        workload.output_tokens,
        segments=workload.segments,
        after=workload.after,
        log_steps=log_steps,
    )


@contextlib.contextmanager
def _covered(step_model: object) -> Iterator[None]:
    """A batch the step model's prediction tables do not hold (Vidur's KeyError of its shape)
    said as what it is: a workload or knobs beyond the ones it was opened for (the step model
    handed over, or its clocks)."""
    try:
        yield
    except KeyError as exc:
        key = exc.args[0] if exc.args else None
        frames = traceback.extract_tb(exc.__traceback__)
        in_vidur = bool(frames) and "vidur" in Path(frames[-1].filename).parts  # its predictor
        clocks = step_model if isinstance(step_model, Sequence) else [step_model]
        modelled = bool(clocks) and all(
            isinstance(c, StepModel | PredictorClock) for c in clocks
        )  # a step model or clocks made from one
        if not modelled or not isinstance(key, tuple) or not in_vidur:
            raise
        raise ValueError(
            f"the step model has no time for a batch of shape {key} (Vidur's prediction "
            "tables cover the workload and knobs it was opened for: longer prompts or outputs, "
            "more requests at once or a larger token budget lie beyond them); open a "
            "simulation for this workload and these knobs (open_simulation)"
        ) from exc


def _simulate_fleet(
    workload: Workload,
    step_model: StepModel | StepClock | Sequence[StepClock],
    engine: EngineSpec,
    seed: int,
    fleet: FleetSpec,
    log_steps: bool,
) -> V1Result:
    from gpu_simulate_test.simulator.fleet import run_fleet
    from gpu_simulate_test.simulator.routers import ROUTERS

    if engine.scheduler != "vllm_v1":
        raise ValueError(f"a fleet runs vllm_v1 engines, not {engine.scheduler}")
    clocks: list[StepClock]
    if isinstance(step_model, StepModel):
        share = 1.0 / fleet.replicas  # each replica's API server takes in about its share
        clocks = [step_model.clock(seed + k, workload.sent_s, share) for k in range(fleet.replicas)]
    elif isinstance(step_model, Sequence) and len(step_model) == fleet.replicas:
        clocks = list(step_model)
    else:
        raise ValueError(
            f"a fleet of {fleet.replicas} engines is timed by a step model (a clock each) or by "
            f"{fleet.replicas} clocks, one per engine"
        )
    router = ROUTERS[fleet.router](fleet.replicas, fleet.router_seed, fleet.poll_s)
    if workload.router_reads is not None and getattr(router, "scrapes", False):
        router.recorded = workload.router_reads  # type: ignore[attr-defined]
    result = run_fleet(
        engine.params,
        clocks,
        router,
        workload.arrival_s,
        workload.prompt_tokens,
        workload.output_tokens,
        segments=workload.segments,
        after=workload.after,
        log_steps=log_steps,
        routed_at=workload.routed_at,
    )
    return result.as_v1()


def latency_table(result: V1Result) -> pd.DataFrame:
    """Per request, on the engine's clock: TTFT, TPOT (first token excluded, as ``vllm bench
    serve``) and E2E in milliseconds."""
    rows = result.requests
    ttft = rows["prefill_e2e_time"].to_numpy(dtype=float)
    e2e = rows["request_e2e_time"].to_numpy(dtype=float)
    outputs = rows["request_num_decode_tokens"].to_numpy(dtype=float)
    tpot = np.full(len(rows), np.nan)
    many = outputs > 1
    tpot[many] = (e2e[many] - ttft[many]) / (outputs[many] - 1.0)
    return pd.DataFrame({"ttft_ms": 1e3 * ttft, "tpot_ms": 1e3 * tpot, "e2e_ms": 1e3 * e2e})
