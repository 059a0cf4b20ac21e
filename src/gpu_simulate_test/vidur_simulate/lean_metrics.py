"""The lean metrics store (``vidur.lean_metrics``), Vidur's ``MetricsStore`` stand-in on Vidur's
loop: only what this stage reads.

Vidur's store takes a third of a simulation's time (issue 19's profile): on every batch it feeds
per-batch and per-token series, DDSketch histograms, MFU and utilization meters, and at the end
writes dozens of CSVs. The stage reads two things from it: the per-request table
(``request_metrics.csv``: :data:`gpu_simulate_test.vidur_simulate.metrics.VIDUR_COLUMNS`) and the
batch compositions (the ``engine_step_log``). :class:`LeanMetrics` records exactly those, with
Vidur's own expressions on the same entity fields, so the stage's ``request_metrics.csv`` is the
same to the last bit (``tests/unit/test_vidur_lean_metrics.py`` compares both stores).

It handles the calls Vidur's events make (``on_request_arrival``, ``on_batch_end``,
``on_replica_schedule``, ``on_replica_stage_schedule``, ``on_batch_stage_end``) and ``plot``,
which the simulator calls at the end; the last three record nothing.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from gpu_simulate_test.vidur_simulate.metrics import VIDUR_ID


class LeanMetrics:
    """Records each finished request's timings and each batch's composition, nothing more."""

    def __init__(self) -> None:
        self._rows: list[dict[str, Any]] = []
        self._batches: list[tuple[int, int, int, int, float]] = []
        self._inter_arrival: dict[int, float] = {}
        self._last_arrived_at: float | None = None

    def on_request_arrival(self, time: float, request: Any) -> None:
        if self._last_arrived_at is not None:
            self._inter_arrival[request.id] = request.arrived_at - self._last_arrived_at
        self._last_arrived_at = request.arrived_at

    def on_batch_end(
        self, time: float, batch: Any, replica_id: Any, memory_usage_percent: int
    ) -> None:
        if getattr(batch, "last_kvp_group_ids", None):
            raise NotImplementedError("KV-parallel batches: use Vidur's own metrics store")
        for request in batch.completed_requests:
            self._request_end(request)
        self._batches.append(
            (
                batch.id,
                batch.size,
                sum([(t if t != 1 else 0) for t in batch.num_q_tokens]),
                batch.num_decode_tokens,
                time - batch.scheduled_at,
            )
        )

    def on_replica_schedule(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_replica_stage_schedule(self, *args: Any, **kwargs: Any) -> None:
        pass

    def on_batch_stage_end(self, *args: Any, **kwargs: Any) -> None:
        pass

    def plot(self) -> None:
        pass

    def _request_end(self, request: Any) -> None:
        # the expressions of Vidur's MetricsStore._on_request_end, on the same fields
        self._rows.append(
            {
                VIDUR_ID: request.id,
                "request_e2e_time": request.e2e_time,
                "request_execution_time": request.execution_time,
                "request_preemption_time": request.preempted_time,
                "request_scheduling_delay": request.scheduling_delay,
                "prefill_e2e_time": request.prefill_completed_at - request.arrived_at,
                "decode_time_execution_plus_preemption_normalized": (
                    request.completed_at - request.prefill_completed_at
                )
                / request.num_decode_tokens,
                "request_num_prefill_tokens": request.num_prefill_tokens,
                "request_num_decode_tokens": request.num_decode_tokens,
                "request_num_restarts": request.num_restarts,
                "request_inter_arrival_delay": self._inter_arrival.get(request.id, math.nan),
            }
        )

    def request_frame(self) -> pd.DataFrame:
        """The rows of Vidur's ``request_metrics.csv`` this stage reads, by request id."""
        return pd.DataFrame(self._rows).sort_values(VIDUR_ID, kind="stable").reset_index(drop=True)

    def batch_series(self) -> dict[str, dict[int, float]]:
        """Per batch id: size, prefill tokens, decode tokens and execution time (s), as the
        per-batch series of Vidur's store hold them."""
        out: dict[str, dict[int, float]] = {"size": {}, "prefill": {}, "decode": {}, "time": {}}
        for batch_id, size, prefill, decode, elapsed in self._batches:
            out["size"][batch_id] = float(size)
            out["prefill"][batch_id] = float(prefill)
            out["decode"][batch_id] = float(decode)
            out["time"][batch_id] = float(elapsed)
        return out
