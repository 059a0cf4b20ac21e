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
least-squares line on the mixed steps' overhead beyond ``requests(N)`` (a prompt prefilled next
to running decodes) when the calibration has them, else on the prefill steps' overhead beyond
``requests(1)``. With mixed steps, what an idle engine's prefill costs on top (waking the engine)
is ``idle_prefill``, charged to batches without decodes: in a trace replay those start on an
idle engine. The predictor adds the overhead to every batch's execution time, so queueing, TTFT,
TPOT and E2E all see it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import nnls  # type: ignore[import-untyped]

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


def step_shape(row: Any) -> tuple[list[int], list[int]]:
    """Per-request query and KV tokens of a calibration row (Vidur's Batch arguments)."""
    batch, q, kv = int(row.batch_size), int(row.num_q_tokens), int(row.context_tokens)
    if row.phase == "mixed":  # one prompt next to batch - 1 decodes
        return [q] + [1] * (batch - 1), [q] + [kv] * (batch - 1)
    return [q] * batch, [kv] * batch


def _nnls_line(x: np.ndarray, y: np.ndarray, scale: np.ndarray) -> tuple[float, float]:
    """Non-negative ``(intercept, slope)`` minimising the error of y relative to ``scale``."""
    design = np.column_stack([np.ones_like(x), x]) / scale[:, None]
    coef, _ = nnls(design, y / scale)
    return float(coef[0]), float(coef[1])


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


def fit(
    backend: str, rows: pd.DataFrame, predict_ms: Callable[[list[int], list[int]], float]
) -> tuple[StepOverhead, pd.DataFrame]:
    """Fit the overhead on ``rows`` (engine_steps of one backend); returns it and a per-row table.

    ``predict_ms(num_q_tokens, num_kv_tokens)`` is Vidur's prediction for one batch; steps it
    has no prediction for (a shape beyond what this simulation predicts) are left out.
    """
    rows, predicted = _predictions(rows, predict_ms, backend)
    measured = rows["step_ms"].to_numpy(dtype=float)
    residual = measured - predicted
    phase = rows["phase"].to_numpy()
    decode, prefill, mixed = phase == "decode", phase == "prefill", phase == "mixed"
    batch = rows["batch_size"].to_numpy(dtype=float)
    tokens = rows["num_q_tokens"].to_numpy(dtype=float)
    base, per_request = _nnls_line(batch[decode], residual[decode], measured[decode])
    by_size = (
        pd.DataFrame({"b": batch[decode].astype(int), "r": np.maximum(residual[decode], 0.0)})
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
    )
    beside = np.array([requests_only.requests_ms(int(b)) for b in batch])
    idle = 0.0
    if mixed.sum() >= 2:  # prefill terms from a busy engine; the idle engine's extra apart
        per_prefill, per_token = _nnls_line(
            tokens[mixed], residual[mixed] - beside[mixed], measured[mixed]
        )
        extra = residual[prefill] - beside[prefill] - per_prefill - per_token * tokens[prefill]
        idle = max(0.0, float(np.median(extra)))
    else:
        per_prefill, per_token = _nnls_line(
            tokens[prefill], residual[prefill] - beside[prefill], measured[prefill]
        )
    overhead = dataclasses.replace(
        requests_only,
        per_prefill_request_ms=per_prefill,
        per_prefill_token_ms=per_token,
        idle_prefill_ms=idle,
    )
    fitted = np.array([overhead.ms(step_shape(row)[0]) for row in rows.itertuples()])
    table = rows[["phase", "batch_size", "num_q_tokens", "context_tokens"]].copy()
    table["measured_ms"] = measured
    table["vidur_ops_ms"] = predicted
    table["overhead_ms"] = fitted
    table["predicted_ms"] = predicted + fitted
    table["error"] = table["predicted_ms"] / table["measured_ms"] - 1
    return overhead, table


class ExecutionTimeWithOverhead:
    """Vidur's ExecutionTime of a batch, plus the engine's overhead in ``total_time``.

    ``model_time`` stays the ops alone (Vidur reports it as model execution time); everything
    else is read from the wrapped object.
    """

    def __init__(self, base: Any, overhead_ms: float) -> None:
        self._base = base
        self.engine_overhead_ms = overhead_ms

    @property
    def total_time(self) -> float:
        return float(self._base.total_time) + self.engine_overhead_ms * 1e-3

    def to_dict(self) -> dict[str, float]:
        base = self._base.to_dict() if hasattr(self._base, "to_dict") else {}
        return {**base, "engine_overhead_time": self.engine_overhead_ms}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def fit_report(overhead: StepOverhead, table: pd.DataFrame) -> dict[str, Any]:
    """What run_meta.json records about the fit."""
    return {
        **asdict(overhead),
        "num_calibration_steps": len(table),
        "calibration_abs_error_max": float(table["error"].abs().max()),
        "calibration_abs_error_median": float(table["error"].abs().median()),
    }
