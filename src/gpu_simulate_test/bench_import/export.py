"""Our runs in ``vllm bench serve``'s result format (vLLM 0.32 ``benchmarks/serve.py``, the JSON
``--save-result --save-detailed`` writes): the same keys in the same order, the same units
(per-request lists in seconds, summaries in ms), computed as vLLM computes them.

Per request, a successful one has its TTFT, ``latencies`` (E2E) and ``itls``; a failed one 0,
0 and ``[]``, with its error, as vLLM saves them. ``itls`` are the gaps between output events
where the run has a token table (a real run); a simulated run has no token times, so its
``itls`` are its TPOT repeated (output tokens − 1) times, which keeps TTFT + Σ ITL = E2E and
its mean TPOT, and makes its ITL distribution that of TPOT. ``start_times`` are arrivals on
the run's clock (from its first scheduled arrival), ``queue_times`` how late each was sent.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.bench_import.contract import VLLM_RESULT_HEADER_KEYS
from gpu_simulate_test.core.metrics import percentiles as pct

DEFAULT_METRICS: tuple[str, ...] = ("ttft", "tpot", "itl")
"""``vllm bench serve``'s default ``--percentile-metrics`` for a generative model."""
DEFAULT_PERCENTILES: tuple[int, ...] = (99,)
"""Its default ``--metric-percentiles``."""
METRICS: tuple[str, ...] = ("ttft", "tpot", "itl", "e2el")


def _stat(values: Sequence[float] | np.ndarray, percentiles: Sequence[int]) -> dict[str, float]:
    """mean, median, std and percentiles in ms, as vLLM (0 for an empty sample: ``x or 0``)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return {"mean": 0.0, "median": 0.0, "std": 0.0, **{f"p{p}": 0.0 for p in percentiles}}
    summary = pct.describe(data, scale=1e3)
    return {
        "mean": summary.mean,
        "median": summary.median,
        "std": summary.std,
        **{f"p{p}": summary.percentiles[p] for p in percentiles},
    }


def request_itls(requests: pd.DataFrame, tokens: pd.DataFrame | None) -> list[list[float]]:
    """Each request's inter-event gaps (s): from the token table where it has the request,
    else its TPOT repeated (output tokens − 1) times (a simulated run)."""
    by_request: Mapping[int, np.ndarray] = {}
    if tokens is not None and len(tokens):
        by_request = {
            int(str(rid)): group["itl_s"].dropna().to_numpy(dtype=float)
            for rid, group in tokens.sort_values(["request_id", "token_index"]).groupby(
                "request_id"
            )
        }
    out: list[list[float]] = []
    for rid, tpot, n, ok in zip(
        requests["request_id"],
        requests["tpot_s"],
        requests["num_decode_tokens"],
        _ok(requests),
        strict=True,
    ):
        if not ok:
            out.append([])
        elif int(rid) in by_request:
            out.append([float(g) for g in by_request[int(rid)]])
        else:
            gap = float(tpot) if math.isfinite(float(tpot)) else 0.0
            out.append([gap] * max(int(n) - 1, 0))
    return out


def _ok(requests: pd.DataFrame) -> np.ndarray:
    return np.asarray(
        (requests["status"] == "ok") & requests["ttft_s"].notna() & requests["e2e_s"].notna()
    )


def _peaks(
    start: np.ndarray, ttft: np.ndarray, e2e: np.ndarray, itls: list[list[float]]
) -> tuple[float, int]:
    """vLLM's ``max_output_tokens_per_s`` and ``max_concurrent_requests``: tokens and running
    requests per one-second bucket from the first send, of the successful requests."""
    if start.size == 0:
        return 0.0, 0
    first = float(start.min())
    buckets = int(np.ceil(float((start + e2e).max()) - first)) + 1
    tokens = np.zeros(buckets)
    running = np.zeros(buckets)
    for s, t, e, gaps in zip(start, ttft, e2e, itls, strict=True):
        times = s + t + np.concatenate(([0.0], np.cumsum(gaps)))
        index = (times - first).astype(int)
        np.add.at(tokens, index[(index >= 0) & (index < buckets)], 1)
        running[int(s - first) : int(s + e - first) + 1] += 1
    return float(tokens.max()), int(running.max())


def vllm_result(
    requests: pd.DataFrame,
    tokens: pd.DataFrame | None,
    header: Mapping[str, Any],
    metrics: Sequence[str] = DEFAULT_METRICS,
    percentiles: Sequence[int] = DEFAULT_PERCENTILES,
) -> dict[str, Any]:
    """A ``request_metrics`` table (and token table) as ``vllm bench serve``'s result JSON.

    ``header`` gives ``backend``, ``label``, ``model_id``, ``tokenizer_id``, ``request_rate``,
    ``burstiness``, ``max_concurrency`` (and optionally ``date``); ``metrics`` and
    ``percentiles`` are ``--percentile-metrics`` and ``--metric-percentiles``.
    """
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric(s) {unknown}; vllm bench serve has {', '.join(METRICS)}")
    pct.select(*percentiles)
    requests = requests.sort_values("request_id").reset_index(drop=True)
    ok = _ok(requests)
    itls = request_itls(requests, tokens)
    backend = header.get("backend")
    rate = header.get("request_rate")
    result: dict[str, Any] = {
        "date": header.get("date") or datetime.now().strftime("%Y%m%d-%H%M%S"),
        "endpoint_type": backend,
        "backend": backend,
        "label": header.get("label"),
        "model_id": header.get("model_id"),
        "tokenizer_id": header.get("tokenizer_id"),
        "num_prompts": len(requests),
        "request_rate": "inf" if rate is None or rate == math.inf else rate,
        "burstiness": header.get("burstiness", 1.0),
        "max_concurrency": header.get("max_concurrency"),
    }
    assert tuple(result) == VLLM_RESULT_HEADER_KEYS
    result.update(_per_request(requests, ok, itls))
    ttft = requests["ttft_s"].to_numpy(dtype=float)
    e2e = requests["e2e_s"].to_numpy(dtype=float)
    n_out = requests["num_decode_tokens"].to_numpy(dtype=int)
    tpots = (e2e[ok] - ttft[ok])[n_out[ok] > 1] / (n_out[ok][n_out[ok] > 1] - 1)
    series = {
        "ttft": ttft[ok],
        "tpot": tpots,
        "itl": [g for gaps, good in zip(itls, ok, strict=True) if good for g in gaps],
        "e2el": e2e[ok],
    }
    for name in METRICS:  # vLLM's order, whatever the order asked
        if name not in metrics:
            continue
        stats = _stat(series[name], percentiles)
        for stat, value in stats.items():
            result[f"{stat}_{name}_ms"] = value
    return result


def _per_request(requests: pd.DataFrame, ok: np.ndarray, itls: list[list[float]]) -> dict[str, Any]:
    """The result's totals, rates and per-request lists, in vLLM's order (a failed request 0
    and ``[]``, with its error); rates over the span from the run's clock 0 to the last
    completion."""
    n_out = requests["num_decode_tokens"].to_numpy(dtype=int)
    n_in = requests["num_prefill_tokens"].to_numpy(dtype=int)
    arrival = requests["arrival_time_s"].to_numpy(dtype=float)
    ttft = requests["ttft_s"].to_numpy(dtype=float)
    e2e = requests["e2e_s"].to_numpy(dtype=float)
    late = (
        (arrival - requests["scheduled_arrival_time_s"].to_numpy(dtype=float))
        if "scheduled_arrival_time_s" in requests
        else np.zeros(len(requests))
    )
    duration = float((arrival[ok] + e2e[ok]).max()) if ok.any() else 0.0
    completed = int(ok.sum())
    total_in, total_out = int(n_in[ok].sum()), int(n_out[ok].sum())
    peak_tokens, peak_running = _peaks(
        arrival[ok], ttft[ok], e2e[ok], [g for g, good in zip(itls, ok, strict=True) if good]
    )
    errors = requests["error"] if "error" in requests else pd.Series([""] * len(requests))
    per_s = (lambda x: x / duration) if duration > 0 else (lambda x: 0.0)
    return {
        "duration": duration,
        "completed": completed,
        "failed": len(requests) - completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": per_s(completed),
        "request_goodput": None,
        "output_throughput": per_s(total_out),
        "total_token_throughput": per_s(total_in + total_out),
        "input_lens": [int(v) for v in n_in],
        "output_lens": [int(v) if good else 0 for v, good in zip(n_out, ok, strict=True)],
        "ttfts": [float(v) if good else 0.0 for v, good in zip(ttft, ok, strict=True)],
        "itls": itls,
        "latencies": [float(v) if good else 0.0 for v, good in zip(e2e, ok, strict=True)],
        "start_times": [float(v) for v in arrival],
        "queue_times": [float(v) if math.isfinite(v) else 0.0 for v in late],
        "generated_texts": [""] * len(requests),
        "errors": [
            "" if good else (str(err) if isinstance(err, str) and err else str(status))
            for good, err, status in zip(ok, errors, requests["status"], strict=True)
        ],
        "max_output_tokens_per_s": peak_tokens,
        "max_concurrent_requests": peak_running,
        "rtfx": 0.0,
    }
