"""Oracle replay: a simulation timed by a real run's own steps (``step_times_from=<run>``).

With the engine's arrivals (its queue stamps) and its step times both taken from the truth, what
is left between the simulation and the run is scheduling. From a real ``vllm`` run's
``engine_schedule.csv`` (the recording scheduler's steps, :mod:`gpu_simulate_test.core.engines.
step_record`), per real step ``k``: when it was scheduled (``S``) and when its outputs were made
(``E``). The simulated step ``k`` then lasts ``E - S`` of the real step ``k`` when both have the
same composition (context and generation requests and tokens, as vLLM counts them); where the
sequences diverge, the median of the real steps of that composition in the run, else a
least-squares line over the run's steps in tokens and requests. Between steps, the engine's own
pause: ``S_k - E_(k-1)`` of the real step when the engine had work, and from the arrival that woke
it to ``S_k`` when it was idle (their medians where the sequences diverge).

A run without a recorded schedule (a server not started by this project) is replayed on its
iteration log instead (``engine_step_log.csv``: each step's full cost, no pauses): approximate,
and the result says so.

A data-parallel run (``backend.data_parallel_size``: an ``engine`` column) gives one clock per
engine (:class:`FleetOracle`), each from that engine's own steps and the requests it queued; the
simulated fleet's engine ``k`` is timed by engine ``k``'s clock, and its router decides anew.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.core.engines.router_reads import READ_BY_CLIENT
from gpu_simulate_test.core.engines.step_record import COMPOSITION, FOREIGN, parse_requests
from gpu_simulate_test.simulator.types import Composition

KEY = COMPOSITION


@dataclass
class OracleClock:
    """A :class:`~.vllm_v1.StepClock` from a real run's steps."""

    keys: list[tuple[int, int, int, int]]
    bodies: np.ndarray
    gaps: np.ndarray
    """Per real step: the pause after the previous step when busy (NaN: it woke from idle)."""
    leads: np.ndarray
    """Per real step: arrival that woke the idle engine to scheduling (NaN: it was busy)."""
    exact: bool
    """From the recorded schedule (True) or from the iteration log's costs (False)."""
    by_key: dict[tuple[int, int, int, int], float] = field(default_factory=dict)
    line: tuple[float, float, float, float] = (0.0, 0.0, 0.0, 0.0)
    used: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        frame = pd.DataFrame(self.keys, columns=list(KEY))
        frame["body"] = self.bodies
        medians = frame.groupby(list(KEY))["body"].median()
        self.by_key = {
            (int(a), int(b), int(c), int(d)): float(body)
            for (a, b, c, d), body in zip(medians.index, medians.to_numpy(), strict=True)
        }
        tokens = frame[KEY[1]] + frame[KEY[3]]
        design = np.column_stack(
            [np.ones(len(frame)), tokens, frame[KEY[0]], frame[KEY[2]]]
        ).astype(float)
        if len(frame) >= 4:
            coef, *_ = np.linalg.lstsq(design, self.bodies, rcond=None)
            self.line = (float(coef[0]), float(coef[1]), float(coef[2]), float(coef[3]))
        elif len(frame):
            self.line = (float(np.median(self.bodies)), 0.0, 0.0, 0.0)
        self._min_body = float(np.min(self.bodies)) if len(self.bodies) else 0.0
        finite_gaps = self.gaps[np.isfinite(self.gaps)]
        finite_leads = self.leads[np.isfinite(self.leads)]
        self._gap = float(np.median(finite_gaps)) if len(finite_gaps) else 0.0
        self._lead = float(np.median(finite_leads)) if len(finite_leads) else 0.0

    # ---- StepClock ----
    def gap(self, index: int) -> float:
        if index < len(self.gaps) and np.isfinite(self.gaps[index]):
            return float(self.gaps[index])
        return self._gap

    def lead(self, index: int) -> float:
        if index < len(self.leads) and np.isfinite(self.leads[index]):
            return float(self.leads[index])
        return self._lead

    def body(self, index: int, step: Composition) -> float:
        if index < len(self.keys) and self.keys[index] == step.key:
            self.used["same position"] += 1
            return float(self.bodies[index])
        known = self.by_key.get(step.key)
        if known is not None:
            self.used["same composition"] += 1
            return known
        self.used["fitted line"] += 1
        a, per_token, per_prefill, per_decode = self.line
        value = (
            a
            + per_token * (step.prefill_tokens + step.decode_tokens)
            + per_prefill * step.prefill_requests
            + per_decode * step.decode_requests
        )
        return max(value, self._min_body)

    def report(self) -> dict[str, Any]:
        total = sum(self.used.values())
        return {
            "source": "engine_schedule" if self.exact else "engine_step_log",
            "exact": self.exact,
            "real_steps": len(self.keys),
            "simulated_steps": total,
            "step_times": dict(self.used),
            "same_position_fraction": self.used["same position"] / total if total else None,
        }


def from_schedule(schedule: pd.DataFrame, queued_s: np.ndarray) -> OracleClock:
    """The clock of a recorded schedule (``engine_schedule`` table) whose requests the engine
    queued at ``queued_s`` (same clock)."""
    start = schedule["start_time_s"].to_numpy(dtype=float)
    end = schedule["end_time_s"].to_numpy(dtype=float)
    queued = np.sort(np.asarray(queued_s, dtype=float))
    prev_end = np.concatenate([[-np.inf], end[:-1]])
    # the arrival that woke an idle engine: the first it queued after the previous step's
    # outputs (later ones, queued before scheduling, join the same step)
    first = np.searchsorted(queued, prev_end, side="right")
    wake = np.where(first < len(queued), queued[np.minimum(first, len(queued) - 1)], np.inf)
    wake = np.where(wake <= start, wake, start)
    # idle when no request was unfinished at the previous step's end: every one queued by then
    # had finished. Finished = its last step ended; count with the schedule's running set.
    running_before = np.concatenate([[0], schedule["num_running"].to_numpy()[:-1]])
    waiting_before = np.concatenate([[0], schedule["num_waiting"].to_numpy()[:-1]])
    finishing = _finishing(schedule)
    busy = (running_before - np.concatenate([[0], finishing[:-1]]) + waiting_before) > 0
    gaps = np.where(busy, start - prev_end, np.nan)
    leads = np.where(busy, np.nan, start - wake)
    keys = [tuple(int(v) for v in row) for row in schedule[list(KEY)].to_numpy()]
    return OracleClock(keys, end - start, gaps, leads, exact=True)  # type: ignore[arg-type]


def _finishing(schedule: pd.DataFrame) -> np.ndarray:
    """Per step, how many of its requests ran for the last time in it."""
    last_step: dict[str, int] = {}
    for index, requests in enumerate(schedule["requests"]):
        for rid, _ in parse_requests(requests):
            last_step[rid] = index
    out = np.zeros(len(schedule), dtype=int)
    for rid, index in last_step.items():
        if rid != FOREIGN:
            out[index] += 1
    return out


def from_step_log(steps: pd.DataFrame) -> OracleClock:
    """The approximate clock of an iteration log (``engine_step_log`` table): each step's full
    cost (:func:`~gpu_simulate_test.core.engines.vllm_log.step_cost_ms`), no pauses."""
    from gpu_simulate_test.core.engines.vllm_log import step_cost_ms

    cost, _ = step_cost_ms(steps)
    keys = [tuple(int(v) for v in row) for row in steps[list(KEY)].to_numpy()]
    nan = np.full(len(steps), np.nan)
    return OracleClock(
        keys,  # type: ignore[arg-type]
        cost.to_numpy(dtype=float) / 1000.0,
        nan,
        nan,
        exact=False,
    )


@dataclass
class FleetOracle:
    """One :class:`OracleClock` per engine of a data-parallel run (engine ``k``'s steps time
    the simulated fleet's engine ``k``)."""

    clocks: list[OracleClock]
    routed_at: np.ndarray | None = None
    """When the real client sent each request (trace order): the simulated router decides
    then, as vLLM's API server routes a request before its engine core queues it."""
    router_reads: Sequence[list[tuple[int, float]] | None] | None = None
    """What the real client's router read of each engine for each request (trace order;
    ``router_reads.csv``): the simulated router decides on these (None: on its engines')."""

    def report(self) -> dict[str, Any]:
        """The engines' reports summed (what :meth:`OracleClock.report` says of one), and each."""
        each = [clock.report() for clock in self.clocks]
        used: Counter[str] = Counter()
        for clock in self.clocks:
            used.update(clock.used)
        total = sum(used.values())
        return {
            "source": each[0]["source"],
            "exact": all(r["exact"] for r in each),
            "engines": len(self.clocks),
            "real_steps": sum(r["real_steps"] for r in each),
            "simulated_steps": total,
            "step_times": dict(used),
            "same_position_fraction": used["same position"] / total if total else None,
            "routed_at": "the client's send" if self.routed_at is not None else "engine arrival",
            "router_reads": READ_BY_CLIENT if self.router_reads is not None else "simulated",
            "per_engine": each,
        }


def fleet_from_schedule(
    schedule: pd.DataFrame,
    queued_s: np.ndarray,
    engine_of: np.ndarray,
    engines: int,
    sent_s: np.ndarray | None = None,
    router_reads: Sequence[list[tuple[int, float]] | None] | None = None,
) -> FleetOracle:
    """A clock per engine of a data-parallel run's recorded schedule (its ``engine`` column);
    ``engine_of``: per request (as ``queued_s``), the engine that queued it; ``sent_s``: when
    the client sent it (the router's decision)."""
    return FleetOracle(
        [
            from_schedule(
                schedule[schedule["engine"] == k].reset_index(drop=True),
                queued_s[engine_of == k],
            )
            for k in range(engines)
        ],
        sent_s,
        router_reads,
    )
