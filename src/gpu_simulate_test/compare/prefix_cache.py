"""The prefix cache, real against simulated: per request the prompt tokens served from the cache,
the hit rate, and TTFT of hits and misses (pure: frames and run_meta in, a JSON block and text
out).

Per request both sides record the hit at the request's first admission (vLLM's
``num_cached_tokens``): the real run as the server's usage reported it (``cached_tokens``) or,
where the usage is empty, as its scheduler recorded it (``engine_cached_tokens``); the
simulation's vLLM-V1 loop as ``cached_tokens``. The **hit rate** is vLLM's: hit tokens / queried
tokens, first admissions only (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``); over
the whole run as each ``run_meta.json`` records it, and over the compared requests from the
per-request columns (queries = their prompt tokens). A request is a **hit** when the real engine
served any of its prompt from the cache (``cached_tokens > 0``), else a **miss**.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.groups import ClockTtft, groups_markdown, ttft_by_group
from gpu_simulate_test.core.reporting import markdown_table

REAL_COLUMNS: tuple[str, ...] = ("cached_tokens", "engine_cached_tokens")
"""The real run's per-request hit, in order of preference: the server's usage, then its
scheduler's record (the same number in vLLM 0.32: ``core/engines/prefix_cache.py``)."""
SIM_COLUMNS: tuple[str, ...] = ("cached_tokens",)
LISTED = 5
"""Differing requests listed by id (all are counted)."""
ONLY_NOTES: Mapping[str, str] = MappingProxyType(
    {
        "real": (
            "Only the real run has per-request cached tokens: its engine served prompt tokens from "
            "its prefix cache, and the simulation has none "
            "(`vidur.scheduler.enable_prefix_caching` off, or a loop without a prefix cache), so "
            "every simulated prompt is computed in full and no per-request or hit-rate comparison "
            "is made. Simulate with "
            "`vidur.scheduler.name=vllm_v1 vidur.scheduler.enable_prefix_caching=true`."
        ),
        "sim": (
            "Only the simulation has per-request cached tokens: the real run recorded none "
            "(`backend.enable_prefix_caching` off, or a server that reports no cached tokens: "
            "`--enable-prompt-tokens-details`), so no per-request or hit-rate comparison is made."
        ),
    }
)


def side_cached(
    frame: pd.DataFrame | None, request_id: np.ndarray, columns: Sequence[str]
) -> tuple[np.ndarray | None, str | None]:
    """The first of ``columns`` that holds a hit for any of ``request_id`` (NaN where a request
    has none, or a negative placeholder), and its name; (None, None) where none does."""
    if frame is None:
        return None, None
    indexed = frame.set_index("request_id").reindex(request_id)
    for column in columns:
        if column not in indexed.columns:
            continue
        values = pd.to_numeric(indexed[column], errors="coerce").to_numpy(dtype=float)
        values = np.where(values < 0, np.nan, values)
        if np.isfinite(values).any():
            return values, column
    return None, None


def token_agreement(
    request_id: np.ndarray, real: np.ndarray, sim: np.ndarray, listed: int = LISTED
) -> dict[str, Any]:
    """Per request with a hit on both sides: the share with the same cached tokens, the mean and
    largest |simulated − real| in tokens, and the first ``listed`` that differ (by id)."""
    both = np.isfinite(real) & np.isfinite(sim)
    diff = np.abs(sim[both] - real[both])
    differ = np.flatnonzero(both & (real != sim))
    nan = float("nan")
    return {
        "requests": int(both.sum()),
        "identical_fraction": float((diff == 0).mean()) if diff.size else nan,
        "mean_abs_diff_tokens": float(diff.mean()) if diff.size else nan,
        "max_abs_diff_tokens": int(diff.max()) if diff.size else None,
        "differing": int(differ.size),
        "first_differing": [
            {"request_id": int(request_id[i]), "real": int(real[i]), "sim": int(sim[i])}
            for i in differ[:listed]
        ],
    }


def hit_rate(hits: Any, queries: Any) -> float | None:
    """``hits / queries`` (tokens); None where either is unknown or nothing was queried."""
    if hits is None or not queries:
        return None
    return float(hits) / float(queries)


def _pair(real: float | None, sim: float | None, **extra: Any) -> dict[str, Any]:
    """Both sides' rate and the difference in percentage points (simulated − real)."""
    points = None if real is None or sim is None else (sim - real) * 100.0
    return {**extra, "real": real, "sim": sim, "difference_points": points}


def run_hit_rates(real_meta: Mapping[str, Any], sim_meta: Mapping[str, Any]) -> dict[str, Any]:
    """The hit rate over each whole run as its ``run_meta.json`` records it: the real engine's
    counters (``engine_log.prefix_cache_hit_rate``, ``_hit_tokens``, ``_query_tokens``), the
    simulation's totals (``prefix_cache``: ``hits``, ``queries``, ``hit_rate``)."""
    log = real_meta.get("engine_log") or {}
    real_hits, real_queries = (
        log.get("prefix_cache_hit_tokens"),
        log.get("prefix_cache_query_tokens"),
    )
    real = log.get("prefix_cache_hit_rate")
    real = hit_rate(real_hits, real_queries) if real is None else float(real)
    totals = sim_meta.get("prefix_cache") or {}
    sim = totals.get("hit_rate")
    sim = hit_rate(totals.get("hits"), totals.get("queries")) if sim is None else float(sim)
    return _pair(
        real,
        sim,
        real_tokens={"hits": real_hits, "queries": real_queries},
        sim_tokens={"hits": totals.get("hits"), "queries": totals.get("queries")},
    )


def compared_hit_rates(
    real: np.ndarray, sim: np.ndarray, prompt_tokens: np.ndarray
) -> dict[str, Any]:
    """The hit rate over the compared requests with a hit on both sides: their cached tokens
    over their prompt tokens, each side."""
    both = np.isfinite(real) & np.isfinite(sim)
    queries = int(np.asarray(prompt_tokens)[both].sum())
    real_hits, sim_hits = int(real[both].sum()), int(sim[both].sum())
    return _pair(
        hit_rate(real_hits, queries),
        hit_rate(sim_hits, queries),
        queries=queries,
        real_hits=real_hits,
        sim_hits=sim_hits,
    )


def hit_labels(real: np.ndarray) -> np.ndarray:
    """``hit`` where the real engine served prompt tokens from its cache, ``miss`` where none,
    ``""`` where it recorded nothing."""
    labels = np.full(real.shape, "", dtype=object)
    labels[real > 0] = "hit"
    labels[real == 0] = "miss"
    return labels


def compare_prefix_cache(
    real: pd.DataFrame,
    sim: pd.DataFrame | None,
    joined: m.JoinedRequests,
    clocks: Sequence[ClockTtft],
    real_meta: Mapping[str, Any],
    sim_meta: Mapping[str, Any],
) -> dict[str, Any] | None:
    """``comparison.json`` ``prefix_cache``: None where neither run has per-request cached
    tokens; where one has, which (``only``) and why nothing is compared (``note``); where both
    have, the per-request agreement, both hit rates and TTFT of hits and misses per clock."""
    real_cached, real_source = side_cached(real, joined.request_id, REAL_COLUMNS)
    if _cache_off(real_meta):  # the scheduler records a 0 hit for every request: nothing cached
        real_cached, real_source = None, None
    sim_cached, _ = side_cached(sim, joined.request_id, SIM_COLUMNS)
    if real_cached is None and sim_cached is None:
        return None
    block: dict[str, Any] = {
        "real_source": real_source,
        "definition": "hit rate = hit tokens / queried tokens, first admissions (vLLM's); "
        "hit: the real engine served > 0 prompt tokens of the request from its cache",
        "run_hit_rate": run_hit_rates(real_meta, sim_meta),
    }
    if real_cached is None or sim_cached is None:
        only = "real" if sim_cached is None else "sim"
        return {**block, "only": only, "note": ONLY_NOTES[only]}
    labels = hit_labels(real_cached)
    return {
        **block,
        "only": None,
        "per_request": token_agreement(joined.request_id, real_cached, sim_cached),
        "compared_hit_rate": compared_hit_rates(real_cached, sim_cached, joined.num_prefill_tokens),
        "ttft_by_hit": ttft_by_group(labels, ("hit", "miss"), clocks),
    }


def _rate(value: float | None) -> str:
    return "–" if value is None else f"{value:.1%}"


def _share(value: float) -> str:
    return f"{value:.0%}" if np.isfinite(value) else "–"


def _points(value: float | None) -> str:
    return "–" if value is None else f"{value:+.1f} points"


def prefix_cache_findings(block: Mapping[str, Any] | None) -> list[str]:
    """The discrepancy lines: both hit rates and the per-request agreement, or which side alone
    has cached tokens."""
    if not block:
        return []
    if block["only"] is not None:
        side = "real run" if block["only"] == "real" else "simulation"
        return [f"per-request prefix-cache hits only in the {side}: nothing of the cache compared"]
    rate, agree = block["compared_hit_rate"], block["per_request"]
    return [
        f"prefix-cache hit rate (tokens) is {_rate(rate['sim'])} simulated vs "
        f"{_rate(rate['real'])} measured ({_points(rate['difference_points'])}); "
        f"{_share(agree['identical_fraction'])} of {agree['requests']} requests hit the same tokens"
    ]


def prefix_cache_markdown(block: Mapping[str, Any] | None) -> str:
    """The ``## Prefix cache`` section of ``summary.md`` (empty without cached tokens)."""
    if not block:
        return ""
    head = "\n## Prefix cache\n\n"
    if block["only"] is not None:
        return head + block["note"] + "\n"
    run, compared, agree = block["run_hit_rate"], block["compared_hit_rate"], block["per_request"]
    source = {
        "cached_tokens": "the server's usage",
        "engine_cached_tokens": "its scheduler's record",
    }[block["real_source"]]
    rates = markdown_table(
        ["hit rate (hit / queried tokens)", "real", "simulated", "difference"],
        [
            ["whole run (run_meta.json)", _rate(run["real"]), _rate(run["sim"]),
             _points(run["difference_points"])],
            [f"compared requests ({compared['queries']} prompt tokens)", _rate(compared["real"]),
             _rate(compared["sim"]), _points(compared["difference_points"])],
        ],
    )  # fmt: skip
    listed = ", ".join(
        f"{d['request_id']} ({d['real']} vs {d['sim']})" for d in agree["first_differing"]
    )
    per_request = (
        f"Per request: {_share(agree['identical_fraction'])} of {agree['requests']} requests "
        "have the same cached tokens on both sides; |simulated − real| mean "
        f"{agree['mean_abs_diff_tokens']:.1f}, max {agree['max_abs_diff_tokens']} tokens"
        + (f"; first differing (real vs simulated): {listed}" if listed else "")
        + "."
    )
    return (
        head
        + "Prompt tokens served from the prefix cache at each request's first admission (real: "
        f"{source}; simulated: the vLLM-V1 loop's), vLLM's hit rate (hit tokens / queried "
        "tokens, first admissions).\n\n"
        + rates
        + "\n\n"
        + per_request
        + "\n\nTTFT (ms) of the requests the real engine served partly from its cache (hit) "
        "and of the rest (miss), error = simulated / real − 1:\n\n"
        + groups_markdown(block["ttft_by_hit"], "real cache")
        + "\n"
    )


def prefix_cache_line(block: Mapping[str, Any] | None) -> str | None:
    """The console's line: both hit rates and the share of requests with the same hit."""
    if not block:
        return None
    if block["only"] is not None:
        side = "real run" if block["only"] == "real" else "simulation"
        return f"prefix cache: cached tokens only in the {side} (summary.md, Prefix cache)"
    rate, agree = block["compared_hit_rate"], block["per_request"]
    return (
        f"prefix cache: hit rate real {_rate(rate['real'])}, simulated {_rate(rate['sim'])} "
        f"({_points(rate['difference_points'])}); {_share(agree['identical_fraction'])} of "
        "requests hit the same tokens"
    )


def _cache_off(meta: Mapping[str, Any]) -> bool:
    """The run's backend had prefix caching off (said so in its config)."""
    backend = (meta.get("config") or {}).get("backend") or {}
    return backend.get("enable_prefix_caching") is False
