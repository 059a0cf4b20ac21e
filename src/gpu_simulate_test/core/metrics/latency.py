"""The one definition of each request latency metric, used by the real bench, the simulator's
wrapper and compare alike (``vllm bench serve``'s conventions):

- **TTFT** = first output token − arrival (queueing included);
- **E2E** = last output token − arrival;
- **TPOT** = (E2E − TTFT) / (output tokens − 1): the mean gap after the first token, NaN for
  fewer than two output tokens;
- **ITL** = the gaps between a request's consecutive output events, pooled over requests.

Each works on floats and on numpy arrays alike (arrays in, arrays out). Their distributions are
summarized by the one percentile routine,
:func:`gpu_simulate_test.core.metrics.percentiles.describe` (one list of percentiles, NaN for an
empty sample).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import overload

import numpy as np
import numpy.typing as npt

Times = float | npt.NDArray[np.float64]


@overload
def ttft_s(arrival_s: float, first_token_s: float) -> float: ...
@overload
def ttft_s(arrival_s: npt.ArrayLike, first_token_s: npt.ArrayLike) -> npt.NDArray[np.float64]: ...
def ttft_s(arrival_s: npt.ArrayLike, first_token_s: npt.ArrayLike) -> Times:
    """Time to first token, queueing included."""
    return _same_kind(np.asarray(first_token_s, float) - np.asarray(arrival_s, float))


@overload
def e2e_s(arrival_s: float, last_token_s: float) -> float: ...
@overload
def e2e_s(arrival_s: npt.ArrayLike, last_token_s: npt.ArrayLike) -> npt.NDArray[np.float64]: ...
def e2e_s(arrival_s: npt.ArrayLike, last_token_s: npt.ArrayLike) -> Times:
    """End-to-end latency: arrival to the last output token."""
    return _same_kind(np.asarray(last_token_s, float) - np.asarray(arrival_s, float))


@overload
def tpot_s(ttft: float, e2e: float, num_output_tokens: int) -> float: ...
@overload
def tpot_s(
    ttft: npt.ArrayLike, e2e: npt.ArrayLike, num_output_tokens: npt.ArrayLike
) -> npt.NDArray[np.float64]: ...
def tpot_s(ttft: npt.ArrayLike, e2e: npt.ArrayLike, num_output_tokens: npt.ArrayLike) -> Times:
    """Time per output token after the first: (E2E − TTFT) / (n − 1); NaN when n < 2."""
    tokens = np.asarray(num_output_tokens, dtype=float)
    decode = np.asarray(e2e, dtype=float) - np.asarray(ttft, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return _same_kind(np.where(tokens >= 2, decode / (tokens - 1), np.nan))


def itls_s(event_times_s: Sequence[float]) -> list[float]:
    """A request's inter-token latencies: the gaps between its consecutive output events."""
    return [b - a for a, b in itertools.pairwise(event_times_s)]


def _same_kind(values: npt.NDArray[np.float64]) -> Times:
    return float(values) if values.ndim == 0 else values
