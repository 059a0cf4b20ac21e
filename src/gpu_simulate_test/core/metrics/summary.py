"""The one run summary, for a real run and a simulated one alike.

:func:`summarize_run` takes a run's requests (their latencies by the one definition,
:mod:`gpu_simulate_test.core.metrics.latency`) and gives a :class:`RunSummary`:

- **one unit: seconds.** Every time in and out is in seconds; a file that keeps milliseconds
  (``real_bench``'s ``summary.json``, keyed like ``vllm bench serve``) converts at its edge, by
  describing a series with ``scale=1e3`` (:meth:`RunSummary.describe`);
- **one time origin: the run's time 0, its first scheduled arrival** (a workload's arrivals
  start at 0; a real replay's clock starts there; a simulated request arrives exactly when
  scheduled). The run's span, which every rate divides by, runs from there to the last output
  token of any request;
- the distributions by the one percentile routine
  (:func:`gpu_simulate_test.core.metrics.percentiles.describe`: NaN for an empty sample), and the
  goodput by :func:`gpu_simulate_test.core.metrics.goodput.goodput` over the same span.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from gpu_simulate_test.config.schema import GoodputConfig
from gpu_simulate_test.core.metrics import percentiles as pct
from gpu_simulate_test.core.metrics.goodput import goodput

NAN = float("nan")
SERIES: tuple[str, ...] = ("ttft", "tpot", "e2e", "itl")
"""The latency series a :class:`RunSummary` describes."""


@dataclass(frozen=True)
class RunSummary:
    """A run's totals and latency series; every time in seconds from the first scheduled
    arrival (see the module)."""

    origin_s: float
    """The run's time 0: its first scheduled arrival."""
    span_s: float
    """From :attr:`origin_s` to the last output token of any request (0 without one)."""
    num_requests: int
    """Requests summarized (those that completed)."""
    num_input_tokens: int
    num_output_tokens: int
    series_s: dict[str, npt.NDArray[np.float64]]
    """Per completed request (``itl``: every gap, pooled), by :data:`SERIES` name."""
    goodput: dict[str, Any] | None
    """:func:`gpu_simulate_test.core.metrics.goodput.goodput` over :attr:`span_s`; None without
    goals."""

    def per_s(self, count: float) -> float:
        """``count`` per second of the span; NaN for a span of 0."""
        return count / self.span_s if self.span_s > 0 else NAN

    def describe(self, series: str, scale: float = 1.0) -> pct.Summary:
        """The distribution of one series, each value times ``scale`` first (``1e3``: in ms,
        converted before the statistics so that they are those of the ms values)."""
        return pct.describe(self.series_s[series], scale=scale)


def _array(values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    return np.asarray(values, dtype=float).ravel()


def summarize_run(
    *,
    scheduled_arrival_s: npt.ArrayLike,
    last_token_s: npt.ArrayLike,
    ttft_s: npt.ArrayLike,
    tpot_s: npt.ArrayLike,
    e2e_s: npt.ArrayLike,
    num_input_tokens: npt.ArrayLike,
    num_output_tokens: npt.ArrayLike,
    itl_s: npt.ArrayLike = (),
    goals: GoodputConfig | None = None,
) -> RunSummary:
    """The summary of a run, every time in seconds on the run's clock.

    ``scheduled_arrival_s`` holds every request's (sent or not: the earliest is the origin, 0
    without any); ``last_token_s`` the last token of every request that had one (a failed
    request's too: the run lasted until then); ``ttft_s``, ``tpot_s``, ``e2e_s`` and the token
    counts the completed requests', one each; ``itl_s`` their pooled inter-token gaps.
    """
    scheduled = _array(scheduled_arrival_s)
    last = _array(last_token_s)
    last = last[~np.isnan(last)]
    origin = float(scheduled.min()) if scheduled.size else 0.0
    span = float(last.max()) - origin if last.size else 0.0
    series = {
        "ttft": _array(ttft_s),
        "tpot": _array(tpot_s),
        "e2e": _array(e2e_s),
        "itl": _array(itl_s),
    }
    good = goodput(goals or GoodputConfig(), series["ttft"], series["tpot"], series["e2e"], span)
    return RunSummary(
        origin_s=origin,
        span_s=span,
        num_requests=len(series["ttft"]),
        num_input_tokens=int(np.sum(np.asarray(num_input_tokens, dtype=np.int64))),
        num_output_tokens=int(np.sum(np.asarray(num_output_tokens, dtype=np.int64))),
        series_s=series,
        goodput=good,
    )
