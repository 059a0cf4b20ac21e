"""The engine's per-step overhead: what a real step costs beyond the ops Vidur predicts.

Vidur 0.0.26 predicts a batch as the sum of its profiled decoder-layer ops times the layer count
(its ``ExecutionTime`` says so: no embedding, no LM head; the CPU-overhead terms of earlier Vidur
releases — schedule, sampler, prepare inputs, process outputs — are gone). The bundle's
``engine_steps.csv`` holds whole steps of the real engine, timed by ``vidur_profile`` with
``engine.enable=true``. Here, for each calibrated step, Vidur's own prediction is subtracted from
the measured time, and the remainder (the overhead) is modelled per batch as

    overhead_ms = requests(N) + per_prefill_request · P_req + per_prefill_token · P_tok
                  [+ idle_prefill when the batch has prefills and no decodes]

N is the number of requests in the batch, P_req and P_tok its prefill requests and their query
tokens. What the engine does per sequence (a row of the LM head, sampling, the Python that
builds inputs and streams outputs) depends on N, not on the phase, and not linearly (hf_cb on
2 CPU cores steps slower at 2 requests than at 4): ``requests`` interpolates the decode steps'
overhead between the calibrated batch sizes and beyond them follows a non-negative line
``base + per_request · N`` fitted on all of them. The prefill terms are a non-negative
least-squares fit over every calibrated step that carries a prompt (the idle prefills and the
mixed steps: a prompt prefilled next to running decodes) of its overhead beyond ``requests(N)``.
With mixed steps, what an idle engine's prefill costs on top (waking the engine) is
``idle_prefill``, a third term of the same fit, charged to batches without decodes: in a trace
replay those start on an idle engine. The predictor adds the overhead to every batch's execution
time, so queueing, TTFT, TPOT and E2E all see it.

An engine can also run Vidur's ops faster than they were timed one by one: with CUDA graphs a
step replays its kernels without the launch gaps the layer profile paid for each op, and
transformers pads every step to a captured size, so a decode of 1 to 32 requests takes the same
22 ms on an H100-class GPU while the profiled ops add up to 26. An overhead cannot be negative,
so the ops are scaled first where they exceed what the measured steps leave them (the median
ratio below 1): a decode-only batch's by ``ops_scale`` (room: the decode step), a batch carrying
a prompt by ``prompt_ops_scale`` (room: the step less ``requests(N)``), each the smallest ratio
of room to ops over its kind of calibrated step, so that no overhead left is negative; the
overhead is fitted on top as above. Without that, such steps would be simulated as their unscaled
ops, too slow, and nothing would say so. The layer profile of an eager GPU run moves with the
host's launch speed: two H200 calibrations of one preset put a decode's ops at 25.7 and 19.4 ms
against 22.3 and 22.6 measured, so either kind of step may need it without the other.

With ``vidur.step_jitter`` the whole step (ops and overhead) is then multiplied by a factor drawn,
per batch, from the calibration's decode-step spread (:class:`StepJitter`): the calibrated
medians stay the model's centre, and single steps stray from them as the real engine's do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import nnls  # type: ignore[import-untyped]

from gpu_simulate_test.calibration import input_spread
from gpu_simulate_test.calibration.busy_hop import KEY as BUSY_HOP_KEY
from gpu_simulate_test.core.profiling.bundle import IDLE_PREFILL_PHASES

MIN_STEPS = 3
"""Calibrated steps needed (at least one decode and two prefill lengths)."""


@dataclass(frozen=True)
class StepOverhead:
    """The fitted per-step overhead of one engine (milliseconds)."""

    backend: str
    base_ms: float
    per_request_ms: float
    per_prefill_request_ms: float
    """What a prefill request costs beyond a decoding one."""
    per_prefill_token_ms: float
    idle_prefill_ms: float
    """Extra for a batch of prefills alone (an idle engine woken by an arrival)."""
    batch_sizes: tuple[int, ...]
    batch_overhead_ms: tuple[float, ...]
    """Measured overhead of the calibrated decode batches (interpolated between them)."""
    ops_scale: float = 1.0
    """Factor on Vidur's profiled ops of a decode-only batch (1: as profiled; below 1 when the
    engine's measured steps are faster than the ops timed one by one, e.g. with CUDA graphs)."""
    prompt_ops_scale: float = 1.0
    """The same for a batch that carries a prompt (a prefill or a chunk of one)."""

    def scale_for(self, num_q_tokens: Sequence[int]) -> float:
        """The factor on the profiled ops of a batch with these query tokens per request."""
        return self.prompt_ops_scale if any(q > 1 for q in num_q_tokens) else self.ops_scale

    def requests_ms(self, num_requests: int) -> float:
        """The per-sequence part for a batch of ``num_requests`` requests."""
        sizes = self.batch_sizes
        if num_requests < sizes[0] or num_requests > sizes[-1]:
            edge = sizes[0] if num_requests < sizes[0] else sizes[-1]
            at_edge = self.batch_overhead_ms[sizes.index(edge)]
            return max(0.0, at_edge + self.per_request_ms * (num_requests - edge))
        return float(np.interp(num_requests, sizes, self.batch_overhead_ms))

    def ms(self, num_q_tokens: Sequence[int]) -> float:
        """Overhead of a batch whose requests process ``num_q_tokens`` query tokens each."""
        prefill = [q for q in num_q_tokens if q > 1]  # Vidur's own split: 1 query token = decode
        idle = self.idle_prefill_ms if len(prefill) == len(num_q_tokens) else 0.0
        return (
            self.requests_ms(len(num_q_tokens))
            + idle
            + self.per_prefill_request_ms * len(prefill)
            + self.per_prefill_token_ms * sum(prefill)
        )


def prompts_of(row: Any) -> int:
    """A calibration row's prompts (``num_prompts``; absent: 1, a prefill's batch_size)."""
    given = getattr(row, "num_prompts", None)
    if given is None or pd.isna(given):  # absent or empty
        return int(row.batch_size) if row.phase == "prefill" else 1
    return int(given)


def step_shape(row: Any) -> tuple[list[int], list[int]]:
    """Per-request query and KV tokens of a calibration row (Vidur's Batch arguments)."""
    batch, q, kv = int(row.batch_size), int(row.num_q_tokens), int(row.context_tokens)
    if row.phase == "mixed":  # k prompts next to batch - k decodes
        k = prompts_of(row)
        return [q] * k + [1] * (batch - k), [q] * k + [kv] * (batch - k)
    # a prefill's KV is its prompt; a cached prefill's the cached prefix and the prefilled rest
    # (context_tokens): the KV after the step, as Vidur's scheduler passes a chunk's
    return [q] * batch, [kv] * batch


def _nnls(columns: Sequence[np.ndarray], y: np.ndarray, scale: np.ndarray) -> list[float]:
    """Non-negative coefficients of ``columns`` minimising the error of y relative to
    ``scale``."""
    design = np.column_stack(columns) / scale[:, None]
    coef, _ = nnls(design, y / scale)
    return [float(c) for c in coef]


def _predictions(
    rows: pd.DataFrame, predict_ms: Callable[[list[int], list[int]], float], backend: str
) -> tuple[pd.DataFrame, np.ndarray]:
    """Vidur's prediction per row, leaving out rows it has none for (KeyError)."""
    kept, values = [], []
    for i, row in enumerate(rows.itertuples()):
        try:
            values.append(predict_ms(*step_shape(row)))
        except KeyError:
            continue
        kept.append(i)
    rows = rows.iloc[kept].reset_index(drop=True)
    phases = set(rows["phase"])
    if len(rows) < MIN_STEPS or not {"prefill", "decode"} <= phases:
        raise ValueError(
            f"engine calibration of {backend}: {len(rows)} steps ({', '.join(sorted(phases))}) "
            f"fall inside the shapes this simulation predicts; at least {MIN_STEPS}, prefill "
            "and decode, are needed"
        )
    return rows, np.array(values)


def _prefill_terms(
    prompts: np.ndarray,
    tokens: np.ndarray,
    extra: np.ndarray,
    measured: np.ndarray,
    prefill: np.ndarray,
    mixed: np.ndarray,
) -> tuple[float, float, float]:
    """``(per_prefill_request, per_prefill_token, idle_prefill)``: one non-negative least-squares
    fit over every step that carries a prompt, of its overhead beyond ``requests(N)`` (``extra``),
    on its ``prompts`` and their query ``tokens`` (a burst's steps carry several: they tell the
    per-prompt term from the per-token one).

    Idle prefills and mixed steps share the per-request and per-token terms; an idle column (1
    on the idle prefills) takes what waking the engine costs, when mixed steps are there to tell
    it apart. Fitting them together keeps the per-token slope on every prompt length measured: the
    mixed steps alone may all have one prompt length (the calibration's longest prompt can lie
    beyond what a simulation predicts, and is then left out), and a slope through one length is
    arbitrary. With fewer than two prompt lengths there is no slope (0).
    """
    carrying = prefill | mixed
    columns = [prompts[carrying]]
    spans_lengths = len(np.unique(tokens[carrying] / prompts[carrying])) >= 2
    if spans_lengths:
        columns.append(tokens[carrying])
    separate_idle = bool(mixed.any()) and bool(prefill.any())
    if separate_idle:
        columns.append(prefill[carrying].astype(float))
    # relative error, as for the decode line
    terms = iter(_nnls(columns, extra[carrying], measured[carrying]))
    per_prefill = next(terms)
    per_token = next(terms) if spans_lengths else 0.0
    idle = next(terms) if separate_idle else 0.0
    return per_prefill, per_token, idle


def _scale(room: np.ndarray, ops: np.ndarray) -> float:
    """1 unless the ops exceed the ``room`` the measured steps leave them (median ratio below
    1); then the smallest ratio (at least 0), so that no step's remaining overhead is
    negative."""
    usable = ops > 0
    if not usable.any():
        return 1.0
    ratios = room[usable] / ops[usable]
    if float(np.median(ratios)) >= 1.0:
        return 1.0
    return max(0.0, float(ratios.min()))  # below 1, as the median is


def fit(
    backend: str, rows: pd.DataFrame, predict_ms: Callable[[list[int], list[int]], float]
) -> tuple[StepOverhead, pd.DataFrame]:
    """Fit the overhead on ``rows`` (engine_steps of one backend); returns it and a per-row table.

    ``predict_ms(num_q_tokens, num_kv_tokens)`` is Vidur's prediction for one batch; steps it
    has no prediction for (a shape beyond what this simulation predicts) are left out. The
    table's ``vidur_ops_ms`` is that prediction as Vidur makes it, before ``ops_scale`` (the
    table's column of the factor each step's ops were scaled by).
    """
    rows, raw_ops = _predictions(rows, predict_ms, backend)
    measured = rows["step_ms"].to_numpy(dtype=float)
    phase = rows["phase"].to_numpy()
    decode, mixed = phase == "decode", phase == "mixed"
    prefill = np.isin(phase, IDLE_PREFILL_PHASES)  # a prompt alone on an idle engine
    scale = _scale(measured[decode], raw_ops[decode])
    batch = rows["batch_size"].to_numpy(dtype=float)
    # a decode step carries no prompt
    prompts = np.array(
        [0 if d else prompts_of(r) for d, r in zip(decode, rows.itertuples(), strict=True)]
    )
    tokens = rows["num_q_tokens"].to_numpy(dtype=float) * prompts
    x = batch[decode]
    decode_residual = measured[decode] - raw_ops[decode] * scale
    base, per_request = _nnls([np.ones_like(x), x], decode_residual, measured[decode])
    by_size = (
        pd.DataFrame({"b": batch[decode].astype(int), "r": np.maximum(decode_residual, 0.0)})
        .groupby("b")["r"]
        .median()
    )
    requests_only = StepOverhead(
        backend=backend,
        base_ms=base,
        per_request_ms=per_request,
        per_prefill_request_ms=0.0,
        per_prefill_token_ms=0.0,
        idle_prefill_ms=0.0,
        batch_sizes=tuple(int(b) for b in by_size.index),
        batch_overhead_ms=tuple(float(v) for v in by_size.to_numpy()),
        ops_scale=scale,
    )
    beside = np.array([requests_only.requests_ms(int(b)) for b in batch])
    # a step with a prompt: its ops get what the measured step leaves beside requests(N)
    prompt_scale = _scale(measured[~decode] - beside[~decode], raw_ops[~decode])
    scales = np.where(decode, scale, prompt_scale)
    predicted = raw_ops * scales
    residual = measured - predicted
    per_prefill, per_token, idle = _prefill_terms(
        prompts.astype(float), tokens, residual - beside, measured, prefill, mixed
    )
    overhead = dataclasses.replace(
        requests_only,
        prompt_ops_scale=prompt_scale,
        per_prefill_request_ms=per_prefill,
        per_prefill_token_ms=per_token,
        idle_prefill_ms=idle,
    )
    fitted = np.array([overhead.ms(step_shape(row)[0]) for row in rows.itertuples()])
    table = rows[["phase", "batch_size", "num_q_tokens", "context_tokens"]].copy()
    table["num_prompts"] = prompts
    table["measured_ms"] = measured
    table["vidur_ops_ms"] = raw_ops
    table["ops_scale"] = scales
    table["overhead_ms"] = fitted
    table["predicted_ms"] = predicted + fitted
    table["error"] = table["predicted_ms"] / table["measured_ms"] - 1
    return overhead, table


@dataclass(frozen=True)
class StepJitter:
    """How single engine steps stray from their calibrated median: the percentiles of
    step / median over the calibration's decode steps (``step_times.step_jitter``)."""

    percentiles: tuple[float, ...]
    ratios: tuple[float, ...]

    @classmethod
    def from_calibration(cls, recorded: Any, where: str) -> StepJitter:
        """From meta.json's ``engine_calibration.<backend>.step_jitter``; ValueError naming
        ``where`` when it is not a usable spread."""
        try:
            percentiles = tuple(float(v) for v in recorded["percentiles"])
            ratios = tuple(float(v) for v in recorded["ratios"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(
                f"{where}: expected {{'percentiles': [...], 'ratios': [...]}}, got {recorded!r}"
            ) from exc
        if (
            len(percentiles) < 2
            or len(percentiles) != len(ratios)
            or percentiles[0] != 0
            or percentiles[-1] != 100
            or any(b <= a for a, b in pairwise(percentiles))
            or any(b < a for a, b in pairwise(ratios))
            or ratios[0] <= 0
        ):
            raise ValueError(
                f"{where}: expected percentiles rising from 0 to 100 and positive, "
                f"non-decreasing ratios of the same length, got {recorded!r}"
            )
        return cls(percentiles, ratios)

    @property
    def mean_ratio(self) -> float:
        """The mean factor a draw gives (the piecewise-linear inverse CDF's integral)."""
        p, r = np.asarray(self.percentiles) / 100, np.asarray(self.ratios)
        return float(np.sum(np.diff(p) * (r[1:] + r[:-1]) / 2))

    def sampler(self, seed: int) -> Callable[[], float]:
        """Seeded draws: a uniform percentile through the inverse CDF, one per call."""
        rng = np.random.default_rng(seed)
        percentiles, ratios = np.asarray(self.percentiles), np.asarray(self.ratios)

        def draw() -> float:
            return float(np.interp(rng.uniform(0.0, 100.0), percentiles, ratios))

        return draw


def step_s(ops_s: float, ops_scale: float, overhead_ms: float) -> float:
    """A batch's time in seconds before its jitter factor: Vidur's ops (seconds) scaled, plus
    the overhead (milliseconds). Vidur's loop and ours both time a batch through this, so that
    they write the same bytes."""
    return ops_s * ops_scale + overhead_ms * 1e-3


class ExecutionTimeWithOverhead:
    """Vidur's ExecutionTime of a batch, plus the engine's overhead in ``total_time``, times
    the step's jitter factor (1 without jitter).

    ``model_time`` stays the ops alone (Vidur reports it as model execution time); everything
    else is read from the wrapped object.
    """

    def __init__(
        self, base: Any, overhead_ms: float, factor: float = 1.0, ops_scale: float = 1.0
    ) -> None:
        self._base = base
        self.engine_overhead_ms = overhead_ms
        self.jitter_factor = factor
        self.ops_scale = ops_scale

    @property
    def total_time(self) -> float:
        step = step_s(float(self._base.total_time), self.ops_scale, self.engine_overhead_ms)
        return step * self.jitter_factor

    def to_dict(self) -> dict[str, float]:
        base = self._base.to_dict() if hasattr(self._base, "to_dict") else {}
        return {
            **base,
            "engine_overhead_time": self.engine_overhead_ms,
            "jitter_factor": self.jitter_factor,
        }

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def fit_report(overhead: StepOverhead, table: pd.DataFrame) -> dict[str, Any]:
    """What run_meta.json records about the fit, with its error per kind of step."""
    by_phase = {
        str(phase): {
            "steps": len(errors),
            "abs_error_median": float(errors.abs().median()),
            "abs_error_max": float(errors.abs().max()),
        }
        for phase, errors in table.groupby("phase")["error"]
    }
    return {
        **asdict(overhead),
        "num_calibration_steps": len(table),
        "calibration_abs_error_max": float(table["error"].abs().max()),
        "calibration_abs_error_median": float(table["error"].abs().median()),
        "calibration_error_by_phase": by_phase,
    }


@dataclass(frozen=True)
class FrontEnd:
    """The serving front end's latency around the engine (milliseconds): a request reaches the
    scheduler ``input_ms + input_per_running_ms · min(running, running_max)`` after it was sent
    (``running``: the requests in flight when it was sent; ``running_max``: the most the
    calibration measured at, never extrapolated past; with none running, ``input_idle_ms``
    where measured), and each token reaches the client
    ``output_ms`` after its step (and the engine loop) ended."""

    input_ms: float
    output_ms: float
    input_per_running_ms: float = 0.0
    running_max: float = float("inf")
    quiet_input_ms: float | None = None
    """The input the calibration's experiments measured, each prompt sent on a quiet client
    (``experiments_input.input_ms`` where the line came from the replays under load; None:
    not recorded): ``vidur.frontend_input=queue``'s base, the wait behind other work apart."""
    input_idle_ms: float | None = None
    """A request sent to an idle engine (none in flight): its own measured way in instead of
    the line's (``input_idle_ms``, calibration version 14 on; None: the line's)."""
    input_residual_ms: tuple[tuple[int, tuple[float, ...]], ...] = ()
    """The measured hops around the input line: per bucket of running requests (its lower
    bound, increasing), their quantiles at :data:`~.input_spread.SPREAD_LEVELS` (empty: not
    recorded, a calibration before version 12): ``vidur.frontend_input_spread``'s draws."""
    busy_hop_residual_ms: tuple[tuple[int, tuple[float, ...]], ...] = ()
    """The hops of the requests sent to a busy engine around the line, fitted through the
    engine's steps (:mod:`~.busy_hop`; per bucket of running requests, merged until each
    holds enough sends; empty: before version 19):
    ``vidur.frontend_busy_hop``'s draws."""

    @property
    def moves_with_load(self) -> bool:
        """Whether a request's way in depends on the requests in flight at its send (a line
        that grows, an idle engine's way in of its own, a busy one's spread): the simulation
        then passes again with the counts the last pass gave."""
        moves = self.input_per_running_ms > 0 or self.input_idle_ms is not None
        return moves or bool(self.busy_hop_residual_ms)

    def input_delays_s(self, running: np.ndarray) -> np.ndarray:
        """Each request's input delay (seconds) given the requests running at its send."""
        at = np.asarray(running, dtype=float)
        ms = self.input_ms + self.input_per_running_ms * np.minimum(at, self.running_max)
        if self.input_idle_ms is not None:
            ms = np.where(at == 0, self.input_idle_ms, ms)
        return ms / 1000.0

    @classmethod
    def from_calibration(cls, recorded: Any, where: str) -> FrontEnd:
        """From ``engine_calibration.<backend>.frontend``; ValueError naming ``where``. The line
        holds up to the most running requests it was measured at (``measured_input_ms``'s keys):
        a straight line through 0, 1 and 4 running is no guide to 15."""
        # input_per_running_ms may be absent: an older calibration, no growth with load
        values = calibrated_ms(
            recorded,
            ("input_ms", "output_ms"),
            where,
            optional=("input_per_running_ms", "input_idle_ms"),
        )
        measured = recorded.get("measured_input_ms")
        try:
            values["running_max"] = running_max(measured)
        except ValueError as exc:
            raise ValueError(
                f"{where}.measured_input_ms: expected running counts as keys, got "
                f"{sorted(measured)!r}"
            ) from exc
        quiet = recorded.get("experiments_input")
        if isinstance(quiet, dict):
            values["quiet_input_ms"] = calibrated_ms(
                quiet, ("input_ms",), f"{where}.experiments_input"
            )["input_ms"]
        residuals = input_spread.residuals(recorded.get("input_residual_ms"), where)
        busy = input_spread.residuals(
            recorded.get(BUSY_HOP_KEY),
            where,
            key=BUSY_HOP_KEY,
            what="the busy sends' hops around the input line",
        )
        return cls(**values, input_residual_ms=residuals, busy_hop_residual_ms=busy)


def running_max(measured: Any) -> float:
    """The most running requests the input line was measured at (``measured_input_ms``'s keys,
    running counts): how far the line is followed, the same in the calibration's fits and the
    simulation (inf without readings); ValueError for a key that is not a count."""
    if not isinstance(measured, dict) or not measured:
        return float("inf")
    return float(max(int(n) for n in measured))


def calibrated_ms(
    recorded: Any, keys: Sequence[str], where: str, optional: Sequence[str] = ()
) -> dict[str, float]:
    """``keys`` (and those of ``optional`` present) of a calibration record, each a finite
    number of milliseconds >= 0; ValueError naming ``where`` and the key otherwise."""
    if not isinstance(recorded, dict):
        raise ValueError(f"{where}: expected a mapping with {' and '.join(keys)}")
    values = {}
    for key in (*keys, *(k for k in optional if k in recorded)):
        value = recorded.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{where}.{key}: expected a number of milliseconds, got {value!r}")
        if not np.isfinite(value) or value < 0:
            raise ValueError(f"{where}.{key}: expected a finite value >= 0, got {value!r}")
        values[key] = float(value)
    return values
