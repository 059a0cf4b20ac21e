"""Vidur's per-request output, checked against the workload and normalised to REQUEST_METRICS.

Vidur's ``request_metrics.csv`` has no arrival column and uses its own names (seconds). Requests
get ids 0..n-1 in trace order (after the entity-id reset), so rows are joined to the workload by
order, after checking that each one was simulated with its exact prompt/output lengths and
arrival gap. Metric conventions are the real bench's (``vllm bench serve``):

- ``ttft_s`` = Vidur ``prefill_e2e_time`` (arrival to first token, queueing included; Vidur
  emits the first output token when the prefill completes);
- ``tpot_s`` = (e2e − ttft) / (output tokens − 1), empty for one-token outputs. Vidur's
  ``decode_time_execution_plus_preemption_normalized`` divides the same span by the output
  tokens *including* the first (and by the post-restart count); it is kept as ``vidur_tpot_s``;
- ``e2e_s`` = Vidur ``request_e2e_time``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.core.metrics import percentiles as pct
from gpu_simulate_test.core.metrics.goodput import GoodputConfig, goals_text, rate_of
from gpu_simulate_test.core.metrics.latency import tpot_s
from gpu_simulate_test.core.metrics.summary import summarize_run
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.simulator.request_rows import VIDUR_ID, inter_arrival_s

ARRIVAL_GAP_TOLERANCE_S = 1e-6
VIDUR_COLUMNS: tuple[str, ...] = (
    VIDUR_ID,
    "request_e2e_time",
    "request_execution_time",
    "request_preemption_time",
    "request_scheduling_delay",
    "prefill_e2e_time",
    "decode_time_execution_plus_preemption_normalized",
    "request_inter_arrival_delay",
    "request_num_prefill_tokens",
    "request_num_decode_tokens",
    "request_num_restarts",
)
"""The columns of Vidur's request_metrics.csv this module reads (times in seconds)."""
EXTRA_COLUMNS: tuple[str, ...] = (
    "scheduled_arrival_time_s",
    "first_token_time_s",
    "last_token_time_s",
    "scheduling_delay_s",
    "preemption_time_s",
    "num_restarts",
    "execution_time_s",
    "vidur_tpot_s",
    "frontend_delay_s",
    "frontend_input_s",
    "held_back_s",
    "frontend_first_token_s",
    "frontend_last_token_s",
)
"""Written after the REQUEST_METRICS columns (and :data:`ENGINE_QUEUED_DELAY`), in this order.
``frontend_delay_s`` is the front end's share added to TTFT and E2E (0 without a front-end
model): the simulated engine's own clock is TTFT and E2E minus it. Its parts, the simulated
first token's hops (compare's ``ttft_parts``): ``frontend_input_s`` (the send to the engine
taking the request in), ``held_back_s`` (waiting there for the step that was running) and
``frontend_first_token_s`` (the first token's way back to the client); NaN where the simulation
did not split it. ``frontend_last_token_s``: the last token's way back, E2E's share beyond the
engine with the first two (the simulated engine's E2E is E2E less those three)."""
ENGINE_QUEUED_DELAY = "engine_scheduling_delay_s"
"""REQUEST_METRICS' optional column, written right after its required ones:
``scheduling_delay_s`` from the moment the engine queued the request (the vLLM-V1 loop queues a
request that arrives during a step right before the next step's scheduling, as vLLM's engine core
does; the real run's column of that name)."""
SUMMARY_PERCENTILES: tuple[int, ...] = pct.select(50, 90, 99)
"""The percentiles of the run summary, from the one list
(:data:`gpu_simulate_test.core.metrics.percentiles.PERCENTILES`)."""
SUMMARY_STATS: tuple[str, ...] = (*pct.names(SUMMARY_PERCENTILES), "mean")


class ReplayMismatchError(ArtifactError):
    """Vidur did not simulate the workload exactly (a request missing or with other lengths)."""


def check_replay(
    raw: pd.DataFrame,
    prefill: np.ndarray,
    decode: np.ndarray,
    arrival_time_s: np.ndarray,
    where: str,
) -> pd.DataFrame:
    """Return Vidur's rows in request order after checking they are exactly the workload.

    A request restarted after preemption reports its re-prefill (prompt + tokens decoded so far)
    as prefill; for those only the total length and a prefill at least the prompt are required.
    """
    missing = [c for c in VIDUR_COLUMNS if c not in raw.columns]
    if missing:
        raise ReplayMismatchError(f"{where}: Vidur output lacks column(s) {', '.join(missing)}")
    n = len(prefill)
    rows = raw.sort_values(VIDUR_ID, kind="stable").reset_index(drop=True)
    ids = rows[VIDUR_ID].to_numpy()
    if len(rows) != n or not np.array_equal(ids, np.arange(n)):
        absent = sorted(set(range(n)) - set(ids.tolist()))
        raise ReplayMismatchError(
            f"{where}: Vidur simulated {len(rows)} of {n} requests"
            + (f"; missing request(s) {absent[:10]}" if absent else "; request ids differ")
        )
    got_prefill = rows["request_num_prefill_tokens"].to_numpy(dtype=np.int64)
    got_decode = rows["request_num_decode_tokens"].to_numpy(dtype=np.int64)
    restarted = rows["request_num_restarts"].to_numpy() > 0
    bad = np.where(
        restarted,
        (got_prefill + got_decode != prefill + decode) | (got_prefill < prefill),
        (got_prefill != prefill) | (got_decode != decode),
    )
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise ReplayMismatchError(
            f"{where}: request {row} was simulated with {got_prefill[row]} prompt + "
            f"{got_decode[row]} output tokens, the workload has {prefill[row]} + {decode[row]} "
            f"({int(bad.sum())} request(s) differ)"
        )
    # each request's gap to the previous arrival in time, checked in time order (the first
    # arrival has none)
    arrivals = np.asarray(arrival_time_s, dtype=float)
    expected = inter_arrival_s(arrivals)
    gaps = rows["request_inter_arrival_delay"].to_numpy(dtype=float)
    later = np.argsort(arrivals, kind="stable")[1:]
    off = later[~(np.abs(gaps[later] - expected[later]) <= ARRIVAL_GAP_TOLERANCE_S)]
    if off.size:
        row = int(off[0])
        raise ReplayMismatchError(
            f"{where}: request {row} arrived {gaps[row]:.9f} s after the previous one in "
            f"Vidur, {expected[row]:.9f} s in the workload"
        )
    return rows


def normalize(
    rows: pd.DataFrame,
    prefill: np.ndarray,
    decode: np.ndarray,
    arrival_time_s: np.ndarray,
    frontend_delay_s: float | np.ndarray = 0.0,
    held_back_s: float | np.ndarray = 0.0,
    frontend_last_s: float | np.ndarray | None = None,
    frontend_first_s: float | np.ndarray | None = None,
) -> pd.DataFrame:
    """REQUEST_METRICS columns, :data:`ENGINE_QUEUED_DELAY`, then :data:`EXTRA_COLUMNS`, from
    checked Vidur rows.

    ``frontend_delay_s`` (per request, or one for all) is the front end's share of a request's
    latency the simulation did not see: its way from the send (``arrival_time_s``) to the
    scheduler plus its tokens' way back to the client. It is added to TTFT and E2E (TPOT, a
    difference of token times, is unchanged). ``held_back_s`` is the part of the simulated wait
    before the engine that vLLM's engine core does not stamp (a request that arrived while a step
    ran is queued as the next step is scheduled): in ``frontend_delay_s``, so that the engine's
    clock starts where the real engine's does, and not added again. ``frontend_last_s``, where
    the last token's way back differs from the first's (the front end as a queue), is added to
    E2E instead (None: ``frontend_delay_s``). ``frontend_first_s``, the first token's way back
    within ``frontend_delay_s``, splits it into its hops (:data:`EXTRA_COLUMNS`; None: not
    split)."""
    arrival = np.asarray(arrival_time_s, dtype=float)
    around = np.asarray(frontend_delay_s, dtype=float)
    around_last = around if frontend_last_s is None else np.asarray(frontend_last_s, dtype=float)
    ttft = rows["prefill_e2e_time"].to_numpy(dtype=float) + around
    e2e = rows["request_e2e_time"].to_numpy(dtype=float) + around_last
    decode = np.asarray(decode, dtype=np.int64)
    tpot = tpot_s(ttft, e2e, decode)
    return pd.DataFrame(
        {
            "request_id": np.arange(len(rows)),
            "arrival_time_s": arrival,
            "num_prefill_tokens": np.asarray(prefill, dtype=np.int64),
            "num_decode_tokens": decode,
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_s": e2e,
            "status": "ok",
            # held back while a step ran is not queued time, as vLLM stamps it
            ENGINE_QUEUED_DELAY: np.maximum(
                0.0,
                rows["request_scheduling_delay"].to_numpy(dtype=float)
                - np.broadcast_to(np.asarray(held_back_s, dtype=float), arrival.shape),
            ),
            # a simulated request arrives exactly when scheduled
            "scheduled_arrival_time_s": arrival,
            "first_token_time_s": arrival + ttft,
            "last_token_time_s": arrival + e2e,
            "scheduling_delay_s": rows["request_scheduling_delay"].to_numpy(dtype=float),
            "preemption_time_s": rows["request_preemption_time"].to_numpy(dtype=float),
            "num_restarts": rows["request_num_restarts"].to_numpy(dtype=np.int64),
            "execution_time_s": rows["request_execution_time"].to_numpy(dtype=float),
            "vidur_tpot_s": rows["decode_time_execution_plus_preemption_normalized"].to_numpy(
                dtype=float
            ),
            "frontend_delay_s": np.broadcast_to(
                around + np.asarray(held_back_s, dtype=float), arrival.shape
            ).astype(float),
            **_hops(arrival.shape, around, around_last, held_back_s, frontend_first_s),
        }
    )


def _hops(
    shape: tuple[int, ...],
    around: np.ndarray,
    around_last: np.ndarray,
    held_back_s: float | np.ndarray,
    first_s: float | np.ndarray | None,
) -> dict[str, np.ndarray]:
    """The front end's share of TTFT split into its hops, and the last token's way back (the
    first's plus what E2E's share, ``around_last``, adds beyond TTFT's); NaN where ``first_s``
    is None."""
    if first_s is None:
        nan = np.full(shape, np.nan)
        return {
            "frontend_input_s": nan,
            "held_back_s": nan,
            "frontend_first_token_s": nan,
            "frontend_last_token_s": nan,
        }
    first = np.broadcast_to(np.asarray(first_s, dtype=float), shape).astype(float)
    return {
        "frontend_input_s": np.broadcast_to(around, shape) - first,
        "held_back_s": np.broadcast_to(np.asarray(held_back_s, dtype=float), shape).astype(float),
        "frontend_first_token_s": first,
        "frontend_last_token_s": first + np.broadcast_to(around_last - around, shape),
    }


def summarize(metrics: pd.DataFrame, goals: GoodputConfig | None = None) -> dict[str, Any]:
    """Latency quantiles (s) and throughput over the run's span, from its first arrival (a
    simulated request arrives when scheduled: the run's time 0) to the last token, by the one
    run summary (:func:`gpu_simulate_test.core.metrics.summary.summarize_run`); ``request_goodput``
    over the same span with ``goals`` (``vllm bench serve --goodput``). A quantile without any
    finite value is NaN (``run_meta.json`` stores it as null), a rate over an empty span None."""
    run = summarize_run(
        scheduled_arrival_s=metrics["arrival_time_s"],
        last_token_s=metrics["last_token_time_s"],
        ttft_s=metrics["ttft_s"],
        tpot_s=metrics["tpot_s"],
        e2e_s=metrics["e2e_s"],
        num_input_tokens=metrics["num_prefill_tokens"],
        num_output_tokens=metrics["num_decode_tokens"],
        goals=goals,
    )

    def rate(count: int) -> float | None:
        return count / run.span_s if run.span_s > 0 else None

    return {
        "request_goodput": rate_of(run.goodput),
        "goodput": run.goodput,
        "num_requests": run.num_requests,
        **{
            f"{name}_s": run.describe(name).stats(SUMMARY_STATS) for name in ("ttft", "tpot", "e2e")
        },
        "makespan_s": run.span_s,
        "throughput_requests_per_s": rate(run.num_requests),
        "throughput_output_tokens_per_s": rate(run.num_output_tokens),
        "num_restarted_requests": int((metrics["num_restarts"] > 0).sum()),
    }


def summary_rows(summary: Mapping[str, Any]) -> list[list[str]]:
    """Rows for the terminal table: latencies in ms (p50, p90, p99), throughput per second."""
    rows: list[list[str]] = []
    for key, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "E2E")):
        q = summary[key]
        rows.append(
            [label]
            + [
                f"{q[p] * 1e3:.2f}" if q[p] is not None and np.isfinite(q[p]) else "-"
                for p in pct.names(SUMMARY_PERCENTILES)
            ]
        )
    rate, tokens = summary["throughput_requests_per_s"], summary["throughput_output_tokens_per_s"]
    rows.append(["throughput", f"{rate:.2f} req/s" if rate else "-", "", ""])
    rows.append(["", f"{tokens:.1f} output tok/s" if tokens else "-", "", ""])
    good = summary.get("goodput")
    if good:
        label = f"goodput ({goals_text(good['goals_ms'])} ms)"
        rows.append([label, f"{good['request_goodput']:.2f} req/s", "", ""])
    return rows
