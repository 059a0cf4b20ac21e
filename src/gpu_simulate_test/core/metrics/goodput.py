"""Goodput as ``vllm bench serve --goodput`` counts it: requests per second that met every goal.

vLLM 0.32 (``vllm/benchmarks/serve.py``, ``calculate_metrics``): ``--goodput ttft:500 tpot:50
e2el:1000`` (milliseconds, any subset). A completed request is good when each goal given is at
least its value (``slo >= value``): TTFT, TPOT = (E2E − TTFT) / (output tokens − 1), taken as 0
for a request of one output token, and E2E latency. Goodput = good requests / the benchmark's
duration (the run's, from its start to the last token). Failed requests are never good.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from gpu_simulate_test.config.schema import GOODPUT_METRICS, GoodputConfig

__all__ = (
    "GOODPUT_METRICS",
    "GoodputConfig",
    "goals_text",
    "good_requests",
    "goodput",
    "rate_of",
    "table_goodput",
)


def good_requests(
    goals_ms: Mapping[str, float],
    ttft_s: np.ndarray | Any,
    tpot_s: np.ndarray | Any,
    e2e_s: np.ndarray | Any,
) -> np.ndarray:
    """Which completed requests met every goal (a boolean per request; a request without a
    finite TTFT or E2E did not complete and is not good)."""
    ttft = np.asarray(ttft_s, dtype=float)
    e2e = np.asarray(e2e_s, dtype=float)
    # vLLM: TPOT of a one-token request is 0 for goodput (ours is NaN there)
    tpot = np.nan_to_num(np.asarray(tpot_s, dtype=float), nan=0.0)
    good = np.isfinite(ttft) & np.isfinite(e2e)
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2el", e2e)):
        if name in goals_ms:
            with np.errstate(invalid="ignore"):
                good &= goals_ms[name] / 1e3 >= values
    return good


def goodput(
    goals: GoodputConfig,
    ttft_s: np.ndarray | Any,
    tpot_s: np.ndarray | Any,
    e2e_s: np.ndarray | Any,
    duration_s: float,
) -> dict[str, Any] | None:
    """``request_goodput`` (req/s), the good requests and the goals; None without goals."""
    goals_ms = goals.goals_ms
    if not goals_ms:
        return None
    count = int(good_requests(goals_ms, ttft_s, tpot_s, e2e_s).sum())
    rate = count / duration_s if duration_s > 0 else float("nan")
    return {"goals_ms": goals_ms, "good_requests": count, "request_goodput": rate}


def table_goodput(table: Any, goals: GoodputConfig) -> dict[str, Any] | None:
    """:func:`goodput` of a request table (``arrival_time_s``, ``ttft_s``, ``tpot_s``,
    ``e2e_s``: a real or simulated run's), over its span from the first arrival to the last
    token."""
    arrival = np.asarray(table["arrival_time_s"], dtype=float)
    end = arrival + np.asarray(table["e2e_s"], dtype=float)
    done = np.isfinite(end)
    span = float(end[done].max() - arrival.min()) if done.any() else 0.0
    return goodput(goals, table["ttft_s"], table["tpot_s"], table["e2e_s"], span)


def rate_of(good: Mapping[str, Any] | None) -> float | None:
    """``request_goodput`` of a :func:`goodput` result; None where there were no goals."""
    return None if good is None else float(good["request_goodput"])


def goals_text(goals_ms: Mapping[str, float]) -> str:
    """The goals as ``--goodput`` takes them: ``ttft:500 tpot:50``."""
    return " ".join(f"{name}:{value:g}" for name, value in goals_ms.items())
