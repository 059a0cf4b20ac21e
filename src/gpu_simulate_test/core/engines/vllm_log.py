"""What a vLLM server says about itself: its per-step log and its Prometheus ``/metrics``.

With ``--enable-logging-iteration-details`` vLLM logs one line per engine step::

    Engine 000: Iteration(12): 1 context requests, 128 context tokens, 3 generation requests,
    3 generation tokens, iteration elapsed time: 71.61 ms, CPU KV cache usage: 0.7%

(context = prefill, generation = decode). :class:`StepLog` collects those lines with the time each
was read off the server's output, and counts the lines that carry the step mark but that it
cannot read (a vLLM whose format changed); :func:`parse_metrics` reads ``/metrics`` with the
Prometheus client's own text parser.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

ITERATION_RE = re.compile(
    r"(?:Engine (?P<engine>\d+): )?"
    r"Iteration\((?P<step>\d+)\): (?P<pr>\d+) context requests, (?P<pt>\d+) context tokens, "
    r"(?P<dr>\d+) generation requests, (?P<dt>\d+) generation tokens, "
    r"iteration elapsed time: (?P<ms>[0-9.]+) ms"
    r"(?:, \w+ KV cache usage: (?P<kv>[0-9.]+)%)?"
)
STEP_MARK = "Iteration("
"""What every per-step line carries (vLLM's ``LoggingStatLogger._log_iteration_details``)."""
VERSION_RE = re.compile(r"version (\d+\.\d+\.\S+)")
KV_TOKENS_RE = re.compile(r"KV cache size: ([0-9,]+) tokens")
UNREADABLE_EXAMPLES = 3
"""Unreadable step lines quoted in a run's record (all of them are counted)."""
UNREADABLE_LINE_CHARS = 300
"""An unreadable line is kept up to this many characters."""


class StepLineError(ValueError):
    """A line carries the step mark but :data:`ITERATION_RE` cannot read it."""


@dataclass(frozen=True)
class EngineStep:
    """One vLLM engine step as its log line tells it."""

    step_index: int
    num_prefill_requests: int
    num_prefill_tokens: int
    num_decode_requests: int
    num_decode_tokens: int
    elapsed_ms: float
    kv_cache_usage_pct: float | None
    engine: int = 0
    """The engine that logged it (``Engine NNN:``; a data-parallel server's rank)."""


def parse_iteration_line(line: str) -> EngineStep | None:
    """The step a log line describes; None for any other line; :class:`StepLineError` for a line
    with the step mark (:data:`STEP_MARK`) in a format this parser does not read."""
    m = ITERATION_RE.search(line)
    if m is None:
        if STEP_MARK in line:
            raise StepLineError(f"not in the expected format: {line!r}")
        return None
    try:
        return EngineStep(
            step_index=int(m["step"]),
            num_prefill_requests=int(m["pr"]),
            num_prefill_tokens=int(m["pt"]),
            num_decode_requests=int(m["dr"]),
            num_decode_tokens=int(m["dt"]),
            elapsed_ms=float(m["ms"]),
            kv_cache_usage_pct=float(m["kv"]) if m["kv"] is not None else None,
            engine=int(m["engine"]) if m["engine"] is not None else 0,
        )
    except ValueError as exc:  # e.g. a time of "1.2.3" ms
        raise StepLineError(f"{exc}: {line!r}") from exc


class StepLog:
    """Engine steps read off a live server log, each with the ``perf_counter`` it was read at,
    and the step lines it could not read (counted, never dropped in silence).

    Also keeps what start-up said: the vLLM version and the KV cache size in tokens.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.steps: list[tuple[float, EngineStep]] = []
        self.unreadable: list[tuple[float, str]] = []
        """Step lines :func:`parse_iteration_line` could not read, with when each was read."""
        self.version: str | None = None
        self.kv_cache_tokens: int | None = None

    def feed(self, line: str, at: float) -> None:
        """A line hook for :class:`~gpu_simulate_test.core.engines.server.ManagedServer`: a step
        line it cannot read is kept in :attr:`unreadable`."""
        try:
            step = parse_iteration_line(line)
        except StepLineError:
            with self._lock:
                self.unreadable.append((at, line[:UNREADABLE_LINE_CHARS]))
            return
        if step is not None:
            with self._lock:
                self.steps.append((at, step))
            return
        if self.version is None and (m := VERSION_RE.search(line)):
            self.version = m.group(1)
        if self.kv_cache_tokens is None and (m := KV_TOKENS_RE.search(line)):
            self.kv_cache_tokens = int(m.group(1).replace(",", ""))

    def unreadable_since(self, since: float) -> tuple[int, list[str]]:
        """How many step lines read at or after ``since`` could not be read, and the first
        :data:`UNREADABLE_EXAMPLES` of them."""
        with self._lock:
            lines = [line for at, line in self.unreadable if at >= since]
        return len(lines), lines[:UNREADABLE_EXAMPLES]

    def sizes(self, engines: int = 1) -> frozenset[int]:
        """The step sizes (prompt plus decode tokens) read so far on every one of ``engines``
        (a data-parallel server's engines each pay a size's one-time cost)."""
        with self._lock:
            seen = [(s.engine, s.num_prefill_tokens + s.num_decode_tokens) for _, s in self.steps]
        each = [{n for e, n in seen if e == engine} for engine in range(engines)]
        return frozenset(set.intersection(*each))

    def frame(self, origin: float, since: float, engines: int = 1) -> pd.DataFrame:
        """Steps read at or after ``since`` (``perf_counter``), times in seconds from ``origin``;
        with ``engines`` > 1 (a data-parallel server), each step's engine in an ``engine``
        column first."""
        with self._lock:
            chosen = [(at, s) for at, s in self.steps if at >= since]
        fleet = {"engine": [s.engine for _, s in chosen]} if engines > 1 else {}
        return pd.DataFrame(
            {
                **fleet,
                "step_index": [s.step_index for _, s in chosen],
                "time_s": [at - origin for at, _ in chosen],
                "num_prefill_requests": [s.num_prefill_requests for _, s in chosen],
                "num_prefill_tokens": [s.num_prefill_tokens for _, s in chosen],
                "num_decode_requests": [s.num_decode_requests for _, s in chosen],
                "num_decode_tokens": [s.num_decode_tokens for _, s in chosen],
                "elapsed_ms": [s.elapsed_ms for _, s in chosen],
                "kv_cache_usage_pct": [s.kv_cache_usage_pct for _, s in chosen],
            }
        )


def parse_metrics(text: str) -> dict[str, float]:
    """Every sample of a Prometheus text exposition, keyed ``name{label="v",...}``.

    Parsed by ``prometheus_client``'s parser (a vLLM dependency), not by hand.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            out[f"{sample.name}{{{labels}}}" if labels else sample.name] = float(sample.value)
    return out


def read_metrics(base_url: str) -> dict[str, float]:
    """A server's ``/metrics`` (:func:`parse_metrics`); empty when it cannot be read (the
    counters are a record, not the measurement)."""
    import httpx

    try:
        return parse_metrics(httpx.get(f"{base_url}/metrics", timeout=10).text)
    except (httpx.HTTPError, ValueError):
        return {}


def remote_version(base_url: str) -> str | None:
    """The vLLM version a server says of itself (``/version``); None when it does not answer."""
    import httpx

    try:
        return str(httpx.get(f"{base_url}/version", timeout=5).json().get("version"))
    except (httpx.HTTPError, ValueError):
        return None


def metric_total(samples: Mapping[str, float], name: str) -> float | None:
    """The sum of ``name`` over all its label sets (None when the server does not export it)."""
    values = [v for k, v in samples.items() if k == name or k.startswith(name + "{")]
    return float(sum(values)) if values else None


SERVER_COUNTERS: tuple[str, ...] = (
    "vllm:prompt_tokens_total",
    "vllm:generation_tokens_total",
    "vllm:prefix_cache_queries_total",
    "vllm:prefix_cache_hits_total",
    "vllm:num_preemptions_total",
    "vllm:request_queue_time_seconds_sum",
    "vllm:request_queue_time_seconds_count",
    "vllm:request_success_total",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count",
)
"""Counters whose change over a run says what the server did: tokens, prefix-cache hits,
preemptions, time requests spent queued, TTFT and E2E on the server's own clock."""


def metrics_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any]:
    """What changed over the run, for :data:`SERVER_COUNTERS` (None where not exported)."""
    out: dict[str, Any] = {}
    for name in SERVER_COUNTERS:
        b, a = metric_total(before, name), metric_total(after, name)
        out[name] = None if a is None else a - (b or 0.0)
    for key, name in (
        ("mean_queue_time_ms", "vllm:request_queue_time_seconds"),
        ("mean_ttft_ms", "vllm:time_to_first_token_seconds"),
        ("mean_e2e_ms", "vllm:e2e_request_latency_seconds"),
    ):
        count, total = out.get(f"{name}_count"), out.get(f"{name}_sum")
        out[key] = 1000.0 * total / count if count and total is not None else None
    return out


MAX_LOOP_GAP_MS = 50.0
"""A step that follows the previous one by more than its own time plus this was not back to back
(the engine waited, or the log line was late): its cadence is not used."""


def step_cost_ms(steps: pd.DataFrame) -> tuple[pd.Series, float]:
    """What each step costs the engine: its own time plus the engine loop around it.

    vLLM times the step (``elapsed_ms``); between two steps its engine loop also schedules,
    processes outputs and hands them to the API server. A step with decodes follows the previous
    one back to back (requests were running), so the gap between their log lines is its full cost.
    Other steps (and Vidur's batches, which have no times) get their own time plus the median of
    that loop time. Returns the costs and the median loop time (0 without times)."""
    elapsed = steps["elapsed_ms"].astype(float)
    period = steps["time_s"].astype(float).diff() * 1000.0
    back_to_back = (
        (steps["num_decode_requests"] > 0)
        & period.notna()
        & (period >= elapsed)
        & (period <= elapsed + MAX_LOOP_GAP_MS)
    )
    loop = float((period - elapsed)[back_to_back].median()) if back_to_back.any() else 0.0
    cost = (elapsed + loop).where(~back_to_back, period)
    return cost, loop
