"""The one percentile routine and the one list of percentiles, used by every stage.

- :data:`PERCENTILES` is the one list: every summary computes all of them, and a table that shows
  fewer picks them by name from it (:func:`select`), so no stage keeps a list of its own. Latency
  tables show :data:`LATENCY_PERCENTILES` or a part of it (the ``vllm bench serve``
  ``--metric-percentiles`` style: p50, p90, p95, p99); ``p10`` is the lower tail of a signed
  distribution (compare's per-request relative errors).
- :func:`describe` summarizes a 1-D sample: count, mean, std, min, max and every percentile, with
  numpy's default (linear) interpolation, as ``vllm bench serve``. The median is ``p50``.
- **Empty input**: values that are not finite (NaN, ±inf) are left out first; a sample with no
  finite value has ``count`` 0 and **NaN for every statistic**, in every stage. Nothing returns
  None or an empty mapping for it; a JSON writer stores the NaN as null
  (:func:`gpu_simulate_test.io.artifacts.write_json`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

PERCENTILES: tuple[int, ...] = (10, 50, 90, 95, 99)
"""The one list of percentiles every summary computes; tables select from it."""
MOMENTS: tuple[str, ...] = ("mean", "std", "min", "max", "median")
"""The other statistics of a :class:`Summary`, by name (``median`` is ``p50``)."""
NAN = float("nan")


def select(*percentiles: int) -> tuple[int, ...]:
    """The percentiles a table shows, checked to be in :data:`PERCENTILES` (raises ValueError
    otherwise: a table cannot show a percentile no summary computes)."""
    unknown = [q for q in percentiles if q not in PERCENTILES]
    if unknown:
        raise ValueError(
            f"percentile(s) {', '.join(map(str, unknown))} not in the one list "
            f"{', '.join(map(str, PERCENTILES))} (gpu_simulate_test.core.metrics.percentiles)"
        )
    return tuple(percentiles)


def name(percentile: int) -> str:
    """A percentile's statistic name: ``p90``."""
    return f"p{select(percentile)[0]}"


def names(percentiles: Iterable[int]) -> tuple[str, ...]:
    """Statistic names of several percentiles, in order."""
    return tuple(name(q) for q in percentiles)


LATENCY_PERCENTILES: tuple[int, ...] = select(50, 90, 95, 99)
"""The percentiles latency tables show (every one of :data:`PERCENTILES` but ``p10``)."""
STAT_NAMES: tuple[str, ...] = (*MOMENTS, *names(PERCENTILES))
"""Every statistic :meth:`Summary.stat` knows."""


@dataclass(frozen=True)
class Summary:
    """Statistics of the finite values of one sample; NaN everywhere when ``count`` is 0."""

    count: int
    mean: float
    std: float
    """Population standard deviation (``numpy.std``, ddof 0, as ``vllm bench serve``)."""
    min: float
    max: float
    percentiles: Mapping[int, float]
    """Each percentile of :data:`PERCENTILES`, linear interpolation."""

    @property
    def median(self) -> float:
        return self.percentiles[50]

    def stat(self, stat: str) -> float:
        """One statistic by name: ``mean``, ``std``, ``min``, ``max``, ``median`` or ``p<q>``
        with ``q`` in :data:`PERCENTILES`; KeyError for any other."""
        if stat in MOMENTS:
            return float(getattr(self, stat))
        if stat.startswith("p") and stat[1:].isdigit() and int(stat[1:]) in self.percentiles:
            return self.percentiles[int(stat[1:])]
        raise KeyError(f"unknown statistic {stat!r}; statistics are {', '.join(STAT_NAMES)}")

    def stats(self, stats: Iterable[str]) -> dict[str, float]:
        """Several statistics by name, in order (see :meth:`stat`)."""
        return {s: self.stat(s) for s in stats}


def _percentiles_of(data: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    # one call: numpy partitions once for every position instead of once per percentile
    return np.asarray(np.percentile(data, PERCENTILES), dtype=float)


def describe(values: npt.ArrayLike | pd.Series, scale: float = 1.0) -> Summary:
    """Count, mean, std, min, max and every percentile of :data:`PERCENTILES` of the finite
    values (NaN and ±inf left out), each value multiplied by ``scale`` first (``1e3``: seconds
    to ms). No finite value: ``count`` 0 and NaN for every statistic."""
    data = np.asarray(values, dtype=float).ravel()
    data = data[np.isfinite(data)] * scale if scale != 1.0 else data[np.isfinite(data)]
    if data.size == 0:
        return Summary(0, NAN, NAN, NAN, NAN, dict.fromkeys(PERCENTILES, NAN))
    at = _percentiles_of(data)
    return Summary(
        count=int(data.size),
        mean=float(data.mean()),
        std=float(data.std()),
        min=float(data.min()),
        max=float(data.max()),
        percentiles={q: float(v) for q, v in zip(PERCENTILES, at, strict=True)},
    )


def ok_request_summaries(requests: pd.DataFrame, metrics: Sequence[str]) -> dict[str, Summary]:
    """:func:`describe` of each ``<metric>_s`` column (seconds) over the ``ok`` requests of a
    ``request_metrics`` table."""
    ok = requests[requests["status"] == "ok"]
    return {metric: describe(ok[f"{metric}_s"].to_numpy(dtype=float)) for metric in metrics}


def latency_ms(
    requests: pd.DataFrame,
    metrics: Sequence[str] = ("ttft", "tpot", "e2e"),
    percentiles: Sequence[int] = LATENCY_PERCENTILES,
) -> dict[str, float]:
    """``<metric>_p<q>`` → ms over the ``ok`` requests of a ``request_metrics`` table (the
    percentiles checked against :data:`PERCENTILES`); NaN where no ok request has the metric."""
    stats = names(percentiles)
    return {
        f"{metric}_{s}": summary.stat(s) * 1e3
        for metric, summary in ok_request_summaries(requests, metrics).items()
        for s in stats
    }
