"""Latency metrics of a replay, as pure functions over :class:`RequestRecord` (no I/O).

Conventions are those of ``vllm bench serve`` (see ``docs/real_bench.md``):

- TTFT = first output token time − arrival time (queueing included).
- E2E = last output token time − arrival time.
- TPOT per request = (E2E − TTFT) / (output tokens − 1); undefined (NaN) with one output token.
- ITL pools every gap between consecutive output events of every request (a streaming chunk that
  carries several tokens is one event, one gap).
- Throughput divides by the duration from time 0 (the first scheduled arrival) to the last token
  (the one run summary, :mod:`gpu_simulate_test.core.metrics.summary`).

Backends with an engine clock (``hf_cb``, ``vllm_engine``) add the same metrics on the engine's
own stamps, from when the engine queued the request (:func:`engine_columns`); ``vllm`` adds each
request's prefix-cache hit as its usage reported it and as its scheduler recorded it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import pandas as pd

from gpu_simulate_test.core.engines.records import (
    STATUS_CANCELLED,
    STATUS_OK,
    TERMINAL_STATUSES,
    RequestRecord,
)
from gpu_simulate_test.core.metrics import percentiles as pct
from gpu_simulate_test.core.metrics.goodput import GoodputConfig, rate_of
from gpu_simulate_test.core.metrics.latency import e2e_s, itls_s, tpot_s, ttft_s
from gpu_simulate_test.core.metrics.summary import summarize_run
from gpu_simulate_test.io.schemas import (
    ENGINE_CLOCK_COLUMNS,
    FLEET_COLUMN,
    PREFIX_CACHE_COLUMNS,
)

PERCENTILES: tuple[int, ...] = pct.select(50, 90, 99)
"""The percentiles ``summary.json`` keeps, from the one list
(:data:`gpu_simulate_test.core.metrics.percentiles.PERCENTILES`)."""
DISTRIBUTION_STATS: tuple[str, ...] = ("mean", "median", "std", *pct.names(PERCENTILES))
NAN = float("nan")


gaps_s = itls_s
"""A request's inter-token latencies (:func:`gpu_simulate_test.core.metrics.latency.itls_s`)."""


def pooled_itls_s(records: Iterable[RequestRecord]) -> list[float]:
    """Every inter-event gap of every request, pooled (vLLM's ITL)."""
    pooled: list[float] = []
    for rec in records:
        pooled.extend(gaps_s(rec.event_times_s))
    return pooled


def is_monotonic(times_s: Sequence[float]) -> bool:
    """True when times never go backwards."""
    return all(b >= a for a, b in itertools.pairwise(times_s))


def request_row(rec: RequestRecord) -> dict[str, Any]:
    """One ``request_metrics`` row (declared columns first, then extras); NaN where undefined."""
    arrival = rec.arrival_s if rec.arrival_s is not None else NAN
    first = rec.event_times_s[0] if rec.event_times_s else NAN
    last = rec.event_times_s[-1] if rec.event_times_s else NAN
    n_out = rec.num_decode_tokens
    ttft = ttft_s(arrival, first)
    e2e = e2e_s(arrival, last)
    row: dict[str, Any] = {
        "request_id": rec.request_id,
        "arrival_time_s": arrival,
        "num_prefill_tokens": rec.num_prefill_tokens,
        "num_decode_tokens": n_out,
        "ttft_s": ttft,
        "tpot_s": tpot_s(ttft, e2e, n_out) if rec.event_times_s else NAN,
        "e2e_s": e2e,
        # a request still in flight when the tables are written (a second Ctrl-C during the
        # cancel loop) ended there: cancelled, so its row is kept and the table stays valid
        "status": rec.status if rec.status in TERMINAL_STATUSES else STATUS_CANCELLED,
        "scheduled_arrival_time_s": rec.scheduled_arrival_s,
        "first_token_time_s": first,
        "last_token_time_s": last,
        "error": rec.error,
        "arrival_error_s": arrival - rec.scheduled_arrival_s,
        "expected_num_decode_tokens": rec.expected_decode_tokens,
        "num_events": len(rec.event_times_s),
        "token_count_mismatch": sum(rec.event_num_tokens) != n_out
        or n_out != rec.expected_decode_tokens,
    }
    row.update(engine_columns(rec))
    row["cached_tokens"] = _or_nan(rec.cached_tokens)
    row["engine_cached_tokens"] = _or_nan(rec.engine_cached_tokens)
    if rec.engine is not None:  # a data-parallel server's engine (io.schemas.FLEET_COLUMN)
        row[FLEET_COLUMN.name] = rec.engine
    return row


def engine_columns(rec: RequestRecord) -> dict[str, float]:
    """The request on the engine's own clock (``io.schemas.ENGINE_CLOCK_COLUMNS``), NaN where
    the engine gave no stamp: the same conventions as the client's columns, from the engine's
    arrival (when it queued the request) instead of the harness's, so the front end (request
    handling before the queue, output handling after the step) is left out.

    - engine TTFT = first token − engine arrival; engine E2E = last token − engine arrival;
    - engine TPOT = (last token − first token) / (output tokens − 1), NaN under two tokens;
    - scheduling delay = first scheduled − engine arrival.

    First and last token come from the per-token stamps where the engine gives them (hf_cb),
    else from its first/last stamps (vLLM's ``RequestStateStats``).
    """
    first = _or_nan(rec.engine_first_token)
    last = _or_nan(rec.engine_last_token)
    arrival = _or_nan(rec.engine_arrival_s)
    scheduled = _or_nan(rec.engine_scheduled_s)
    return {
        "engine_arrival_time_s": arrival,
        "engine_scheduled_time_s": scheduled,
        "engine_first_token_time_s": first,
        "engine_last_token_time_s": last,
        "engine_ttft_s": ttft_s(arrival, first),
        # (E2E - TTFT) / (n - 1) with both from the same arrival is (last - first) / (n - 1)
        "engine_tpot_s": tpot_s(first, last, rec.num_decode_tokens),
        "engine_e2e_s": e2e_s(arrival, last),
        "engine_scheduling_delay_s": scheduled - arrival,
    }


def has_engine_clock(rec: RequestRecord) -> bool:
    """Whether the engine stamped this request's arrival and its first token."""
    return rec.engine_arrival_s is not None and (
        bool(rec.engine_token_times_s) or rec.engine_first_token_s is not None
    )


def _or_nan(value: float | None) -> float:
    return NAN if value is None else value


def token_rows(rec: RequestRecord) -> list[dict[str, Any]]:
    """``token_metrics`` rows of one request: one per output event.

    ``token_index`` is the 0-based index of the event's last token; ``num_tokens`` says how many it
    carried (always 1 for the hf backends, so there is exactly one row per token).
    """
    rows: list[dict[str, Any]] = []
    engine = rec.engine_token_times_s
    with_engine = len(engine) == len(rec.event_times_s) and bool(engine)
    index = -1
    previous: float | None = None
    for i, (time_s, count) in enumerate(zip(rec.event_times_s, rec.event_num_tokens, strict=True)):
        index += count
        row: dict[str, Any] = {
            "request_id": rec.request_id,
            "token_index": index,
            "time_s": time_s,
            "itl_s": NAN if previous is None else time_s - previous,
            "num_tokens": count,
        }
        if with_engine:
            row["engine_time_s"] = engine[i]
            row["engine_itl_s"] = NAN if i == 0 else engine[i] - engine[i - 1]
        rows.append(row)
        previous = time_s
    return rows


def request_frame(records: Sequence[RequestRecord]) -> pd.DataFrame:
    """``request_metrics`` of every request that arrived, in request order."""
    rows = [request_row(r) for r in records if r.arrival_s is not None]
    return pd.DataFrame(rows, columns=None if rows else list(_REQUEST_COLUMNS))


def token_frame(records: Sequence[RequestRecord]) -> pd.DataFrame:
    """``token_metrics`` of every request, ordered by request then token."""
    rows = [row for r in records for row in token_rows(r)]
    return pd.DataFrame(rows, columns=None if rows else list(_TOKEN_COLUMNS))


_REQUEST_COLUMNS: tuple[str, ...] = (
    "request_id",
    "arrival_time_s",
    "num_prefill_tokens",
    "num_decode_tokens",
    "ttft_s",
    "tpot_s",
    "e2e_s",
    "status",
    *(c.name for c in ENGINE_CLOCK_COLUMNS),
    *(c.name for c in PREFIX_CACHE_COLUMNS),
)
_TOKEN_COLUMNS: tuple[str, ...] = ("request_id", "token_index", "time_s", "itl_s", "num_tokens")


def distribution_ms(values_s: Sequence[float]) -> dict[str, float]:
    """:data:`DISTRIBUTION_STATS` in milliseconds of the finite values (NaN if none), by
    :func:`gpu_simulate_test.core.metrics.percentiles.describe`."""
    return pct.describe(values_s, scale=1e3).stats(DISTRIBUTION_STATS)


def summarize(
    records: Sequence[RequestRecord], goals: GoodputConfig | None = None
) -> dict[str, Any]:
    """Run totals and latency distributions, keyed like ``vllm bench serve``'s saved results:
    the one run summary (:func:`gpu_simulate_test.core.metrics.summary.summarize_run`, seconds from
    the first scheduled arrival, the replay clock's 0), its latencies converted to ms here.

    Latency metrics and throughput count successful (``ok``) requests only, as vLLM does;
    ``request_goodput`` (null without ``goals``) counts those that met every goal, as
    ``vllm bench serve --goodput`` (:mod:`gpu_simulate_test.core.metrics.goodput`).
    """
    arrived = [r for r in records if r.arrival_s is not None]
    ok = [r for r in arrived if r.status == STATUS_OK and r.event_times_s]
    rows = [request_row(r) for r in ok]
    run = summarize_run(
        # a closed-loop turn never sent was never scheduled (NaN): the origin is the sessions'
        scheduled_arrival_s=[
            r.scheduled_arrival_s for r in records if not math.isnan(r.scheduled_arrival_s)
        ],
        last_token_s=[r.event_times_s[-1] for r in arrived if r.event_times_s],
        ttft_s=[row["ttft_s"] for row in rows],
        tpot_s=[row["tpot_s"] for row in rows],
        e2e_s=[row["e2e_s"] for row in rows],
        num_input_tokens=[r.num_prefill_tokens for r in ok],
        num_output_tokens=[r.num_decode_tokens for r in ok],
        itl_s=pooled_itls_s(ok),
        goals=goals,
    )
    total_input, total_output = run.num_input_tokens, run.num_output_tokens
    summary: dict[str, Any] = {
        "duration": run.span_s,
        "completed": run.num_requests,
        "failed": len(arrived) - len(ok),
        "num_prompts": len(records),
        "num_not_sent": len(records) - len(arrived),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": run.per_s(run.num_requests),
        "output_throughput": run.per_s(total_output),
        "total_token_throughput": run.per_s(total_input + total_output),
        "input_lens": [r.num_prefill_tokens for r in ok],
        "output_lens": [r.num_decode_tokens for r in ok],
        "ttfts": [row["ttft_s"] for row in rows],
        # then each closed-loop turn not sent, with why (its session's previous turn failed)
        "errors": [r.error for r in arrived if r.status != STATUS_OK]
        + [r.error for r in records if r.arrival_s is None and r.error],
    }
    for name, series in (("ttft", "ttft"), ("tpot", "tpot"), ("itl", "itl"), ("e2el", "e2e")):
        dist = run.describe(series, scale=1e3).stats(DISTRIBUTION_STATS)
        summary[f"mean_{name}_ms"] = dist["mean"]
        summary[f"median_{name}_ms"] = dist["median"]
        summary[f"std_{name}_ms"] = dist["std"]
        for p in PERCENTILES:
            summary[f"p{p}_{name}_ms"] = dist[f"p{p}"]
    arrival_errors = pct.describe(
        [r.arrival_s - r.scheduled_arrival_s for r in arrived if r.arrival_s is not None],
        scale=1e3,
    )
    summary["request_goodput"] = rate_of(run.goodput)
    summary["goodput"] = run.goodput
    summary["arrival_error_ms"] = arrival_errors.stats(DISTRIBUTION_STATS)
    summary["max_arrival_error_ms"] = arrival_errors.max
    summary.update(engine_summary([r for r in ok if has_engine_clock(r)]))
    return summary


ENGINE_SERIES: tuple[str, ...] = ("ttft", "tpot", "e2e", "scheduling_delay")
"""The engine-clock distributions ``summary.json`` keeps (``engine_<name>_ms``)."""


def engine_summary(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """``engine_<metric>_ms`` distributions (:data:`DISTRIBUTION_STATS`) of the requests the
    engine stamped, and how the client's TTFT exceeds the engine's (the front end's share);
    empty when there are none (a backend without an engine clock)."""
    if not records:
        return {}
    rows = [request_row(r) for r in records]
    out: dict[str, Any] = {"engine_clock_requests": len(rows)}
    for name in ENGINE_SERIES:
        out[f"engine_{name}_ms"] = distribution_ms([row[f"engine_{name}_s"] for row in rows])
    out["ttft_minus_engine_ttft_ms"] = distribution_ms(
        [row["ttft_s"] - row["engine_ttft_s"] for row in rows]
    )
    return out
