"""Metric math of the comparison: pure functions over typed per-request records.

Conventions (those of ``vllm bench serve``, docs/real_bench.md): TTFT includes queueing; TPOT per
request = (E2E − TTFT) / (output tokens − 1), undefined (NaN) with one output token; ITL pools
every inter-token gap; throughput = ok requests (or their output tokens) / duration, duration =
time 0 → last token. Relative error is ``simulated / real − 1``: positive means the simulator
predicts a longer time than measured (too slow), negative too fast.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from gpu_simulate_test.core.metrics import percentiles as pct

STATS: tuple[str, ...] = (*pct.names(pct.LATENCY_PERCENTILES), "mean")
"""The statistics of every distribution table, in order (the latency percentiles of the one
list, :mod:`gpu_simulate_test.core.metrics.percentiles`, and the mean)."""
METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2e", "scheduling_delay")
"""Compared metrics; ``itl`` has no per-token times on the simulated side (Vidur gives none)."""
METRIC_LABELS: Mapping[str, str] = MappingProxyType(
    {
        "ttft": "TTFT",
        "tpot": "TPOT",
        "itl": "ITL",
        "e2e": "E2E",
        "scheduling_delay": "scheduling delay",
    }
)
PER_REQUEST_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e")
"""Metrics defined per request on both sides, so per-request errors exist."""


@dataclass(frozen=True)
class Distribution:
    """Summary of one latency distribution, in seconds; NaN everywhere when ``count`` is 0."""

    count: int
    p50: float
    p90: float
    p95: float
    p99: float
    mean: float

    def stat(self, name: str) -> float:
        if name not in STATS:
            raise KeyError(f"unknown statistic {name!r}; statistics are {', '.join(STATS)}")
        return float(getattr(self, name))


@dataclass(frozen=True)
class StatError:
    """One statistic of one metric on both sides and the simulator's relative error."""

    stat: str
    real_s: float
    sim_s: float
    signed_rel_error: float
    """``sim / real − 1`` (NaN when either side is missing or real is 0)."""
    abs_rel_error: float


@dataclass(frozen=True)
class ErrorSummary:
    """Distribution of per-request signed relative errors ``sim / real − 1``."""

    count: int
    mean: float
    p10: float
    p50: float
    p90: float
    mean_abs: float
    """Mean absolute relative error (MAPE as a fraction)."""
    p90_abs: float
    within_10pct: float
    """Fraction of requests with ``|error| <= 0.10``."""
    within_25pct: float


@dataclass(frozen=True)
class Throughput:
    """Completed requests and output tokens per second over time 0 (or the end of a warm-up
    left out) → last token."""

    num_requests: int
    output_tokens: int
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float


@dataclass(frozen=True)
class SideTimes:
    """Per-request times of one side (real or simulated), aligned with :class:`JoinedRequests`."""

    arrival_time_s: np.ndarray
    ttft_s: np.ndarray
    tpot_s: np.ndarray
    e2e_s: np.ndarray
    scheduling_delay_s: np.ndarray
    """Arrival → first scheduled (queueing); NaN where the side does not record it."""

    def metric(self, name: str) -> np.ndarray:
        return np.asarray(getattr(self, f"{name}_s"), dtype=float)


@dataclass(frozen=True)
class JoinedRequests:
    """Requests completed (``ok``) on both sides, joined by request id."""

    request_id: np.ndarray
    num_prefill_tokens: np.ndarray
    num_decode_tokens: np.ndarray
    real: SideTimes
    sim: SideTimes

    def __len__(self) -> int:
        return int(self.request_id.size)


def _finite(values: Sequence[float] | np.ndarray) -> np.ndarray:
    array = np.asarray(values, dtype=float)
    keep = np.isfinite(array)
    return array if keep.all() else array[keep]


def distribution(values_s: Sequence[float] | np.ndarray) -> Distribution:
    """:data:`STATS` of the finite values
    (:func:`gpu_simulate_test.core.metrics.percentiles.describe`: numpy's linear interpolation, as
    vLLM; NaN when there is none)."""
    summary = pct.describe(values_s)
    return Distribution(count=summary.count, **summary.stats(STATS))


def relative_error(sim: float, real: float) -> float:
    """``sim / real − 1``; NaN when either is NaN or real is 0."""
    if not (np.isfinite(sim) and np.isfinite(real)) or real == 0:
        return float("nan")
    return float(sim / real - 1.0)


def compare_distributions(real: Distribution, sim: Distribution) -> tuple[StatError, ...]:
    """Signed and absolute relative error of every statistic in :data:`STATS`."""
    rows = []
    for name in STATS:
        r, s = real.stat(name), sim.stat(name)
        signed = relative_error(s, r)
        rows.append(StatError(name, r, s, signed, abs(signed)))
    return tuple(rows)


def per_request_errors(sim: np.ndarray, real: np.ndarray) -> np.ndarray:
    """Per-request ``sim / real − 1``; NaN where either is undefined or real is 0."""
    s, r = np.asarray(sim, dtype=float), np.asarray(real, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = s / r - 1.0
    out[~(np.isfinite(s) & np.isfinite(r)) | (r == 0)] = np.nan
    return out


def error_summary(signed_errors: np.ndarray) -> ErrorSummary:
    """Summary of per-request signed relative errors (NaNs dropped; NaN when none is left)."""
    signed = pct.describe(signed_errors)
    absolute = np.abs(_finite(signed_errors))
    magnitude = pct.describe(absolute)
    nan = float("nan")
    return ErrorSummary(
        count=signed.count,
        **signed.stats(("mean", *pct.names((10, 50, 90)))),
        mean_abs=magnitude.mean,
        p90_abs=magnitude.stat(pct.name(90)),
        within_10pct=float((absolute <= 0.10).mean()) if absolute.size else nan,
        within_25pct=float((absolute <= 0.25).mean()) if absolute.size else nan,
    )


def throughput(
    arrival_time_s: np.ndarray,
    e2e_s: np.ndarray,
    num_decode_tokens: np.ndarray,
    since_s: float = 0.0,
) -> Throughput:
    """Requests/s and output tokens/s of completed requests; duration = ``since_s`` (time 0, or
    the end of a warm-up whose requests were left out) → last token."""
    arrival = np.asarray(arrival_time_s, dtype=float)
    e2e = np.asarray(e2e_s, dtype=float)
    done = np.isfinite(e2e)
    tokens = int(np.asarray(num_decode_tokens)[done].sum())
    count = int(done.sum())
    duration = float((arrival[done] + e2e[done]).max()) - since_s if count else float("nan")
    if not count or duration <= 0:
        return Throughput(count, tokens, duration, float("nan"), float("nan"))
    return Throughput(count, tokens, duration, count / duration, tokens / duration)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation of the pairs where both are finite; NaN when undefined."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(a) & np.isfinite(b)
    if keep.sum() < 3:
        return float("nan")
    ra = _ranks(a[keep])
    rb = _ranks(b[keep])
    if ra.std() == 0 or rb.std() == 0:
        return float("nan")
    return float(np.corrcoef(ra, rb)[0, 1])


def _ranks(values: np.ndarray) -> np.ndarray:
    """Average ranks (ties share the mean of their positions), 0-based; one sort."""
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    starts_group = np.empty(values.size, dtype=bool)
    starts_group[:1] = True
    starts_group[1:] = ordered[1:] != ordered[:-1]
    first = np.flatnonzero(starts_group)  # sorted position where each group of equals begins
    last = np.append(first[1:], values.size) - 1
    ranks = np.empty(values.size, dtype=float)
    ranks[order] = ((first + last) / 2.0)[np.cumsum(starts_group) - 1]
    return ranks


def offered_qps(arrival_time_s: np.ndarray) -> float:
    """Mean arrival rate: (requests − 1) / (last − first arrival); inf when all arrive at once."""
    arrival = np.sort(_finite(arrival_time_s))
    if arrival.size < 2:
        return float("nan")
    span = float(arrival[-1] - arrival[0])
    return float("inf") if span <= 0 else (arrival.size - 1) / span
