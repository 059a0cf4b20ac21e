"""A vLLM server's prefix cache as a real run measures it (``backend.enable_prefix_caching``).

- **Reset**: ``POST /reset_prefix_cache`` (vLLM registers it only with ``VLLM_SERVER_DEV_MODE=1``)
  drops every cached block hash, so a run, and its repeat, starts from an empty cache. vLLM
  refuses (``{"success": false}``) while a request holds blocks; :func:`reset` retries a while,
  then fails the run.
- **Hit rate**: ``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``, both in tokens, over
  the run (the counters' change): vLLM's own definition, first admissions only (re-admissions
  after preemption are counted apart).
- **Per request, twice**: the server's ``usage.prompt_tokens_details.cached_tokens`` (with
  ``--enable-prompt-tokens-details``) and the recording scheduler's admission hit
  (:mod:`.vllm_recording_scheduler`) are the same number in vLLM 0.32 (``PrefillStats``):
  :func:`agreement` says where they differ.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Literal

from gpu_simulate_test.core.engines.base import BackendError
from gpu_simulate_test.core.engines.records import RequestRecord

RESET_PATH = "/reset_prefix_cache"
DEV_MODE_ENV: Mapping[str, str] = MappingProxyType({"VLLM_SERVER_DEV_MODE": "1"})
"""What a server needs in its environment to serve :data:`RESET_PATH`."""
RESET_RETRY_S = 10.0
"""How long ``success: false`` (blocks still held) is retried before the run fails."""
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
MAX_LISTED = 20
"""Disagreeing requests listed by id in ``run_meta.json`` (all are counted)."""

Reset = Literal["off", "fresh_server", "endpoint"]
"""How a run's cache was emptied: caching off; a server started for the run and sent nothing
before it; or :data:`RESET_PATH` after the warm-up."""


def reset(client: Any, base_url: str, retry_s: float = RESET_RETRY_S) -> None:
    """``POST /reset_prefix_cache`` on ``base_url`` with ``client`` (an ``httpx.Client``);
    :class:`BackendError` naming the cause where the server refuses or cannot."""
    import httpx

    url = f"{base_url}{RESET_PATH}"
    deadline = time.monotonic() + retry_s
    while True:
        try:
            response = client.post(url)
        except httpx.HTTPError as exc:
            raise BackendError(f"POST {url} failed: {exc}") from exc
        if response.status_code == 404:
            raise BackendError(
                f"POST {url}: 404, the server does not serve it; vLLM does only with "
                "VLLM_SERVER_DEV_MODE=1 in its environment (a server started here gets it with "
                "backend.enable_prefix_caching=true)"
            )
        if response.status_code != 200:
            raise BackendError(f"POST {url}: HTTP {response.status_code}: {response.text[:300]}")
        try:
            answer = response.json()
        except ValueError as exc:
            raise BackendError(f"POST {url}: not JSON: {response.text[:300]!r}") from exc
        if isinstance(answer, Mapping) and answer.get("success") is True:
            return
        if time.monotonic() >= deadline:
            raise BackendError(
                f"POST {url} answered {answer!r} for {retry_s:g} s: vLLM resets its prefix "
                "cache only when no request holds blocks (is another client's request running?)"
            )
        time.sleep(0.5)


def hit_rate(delta: Mapping[str, Any]) -> float | None:
    """Hit tokens / queried tokens over the run (:data:`HITS`, :data:`QUERIES` in ``delta``,
    the counters' change); None where not exported or nothing was queried."""
    hits, queries = delta.get(HITS), delta.get(QUERIES)
    if hits is None or not queries:
        return None
    return float(hits) / float(queries)


def agreement(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """The server's ``cached_tokens`` against the scheduler's admission hit, per request that has
    both: how many were compared and which differ (the first :data:`MAX_LISTED` by id)."""
    both = [
        r for r in records if r.cached_tokens is not None and r.engine_cached_tokens is not None
    ]
    differ = [r for r in both if r.cached_tokens != r.engine_cached_tokens]
    return {
        "usage_reported": sum(r.cached_tokens is not None for r in records),
        "scheduler_recorded": sum(r.engine_cached_tokens is not None for r in records),
        "requests_compared": len(both),
        "cached_tokens": sum(r.cached_tokens or 0 for r in both),
        "disagreements": len(differ),
        "disagreeing": [
            {
                "request_id": r.request_id,
                "usage": r.cached_tokens,
                "scheduler": r.engine_cached_tokens,
            }
            for r in differ[:MAX_LISTED]
        ],
    }
