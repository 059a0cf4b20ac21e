"""Join a real and a simulated run per request and compare them (pure: frames in, records out).

A request counts when it is ``ok`` on both sides; the others are listed as excluded with their
status, and every statistic is computed over the same set of requests on both sides.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.core.metrics import latency
from gpu_simulate_test.io.artifacts import ArtifactError

TREND_MIN_RHO = 0.3
"""Smallest |Spearman ρ| between per-request |error| and a length that is reported as a trend."""
NOTABLE_ERROR = 0.10
"""A relative error beyond ±10% is called out in the discrepancy section."""
NOTABLE_GAP_S = 0.25e-3
"""...unless every p50/p90/p99 of that metric is within this of the measurement: a quantity near
zero on both sides (a vLLM server's scheduling delay, tens of microseconds) is then said in
milliseconds, not as a ratio (0.19 against 0.04 ms read "4.4x too high" at the top of the list).
A part of TTFT (the scheduling delay) is said so too while its gap is under
``TTFT_SHARE`` of the measured TTFT p50: it cannot move the TTFT by a notable error (0.31 against
0.03 ms, next to a TTFT of 26 ms, read "5.6x too high" first)."""
TTFT_SHARE = NOTABLE_ERROR / 2
TTFT_PARTS = frozenset({"scheduling_delay"})


@dataclass(frozen=True)
class Excluded:
    """A request left out of the comparison, and why."""

    request_id: int
    real_status: str
    sim_status: str


@dataclass(frozen=True)
class MetricComparison:
    """One metric: both distributions, their relative errors and the per-request errors."""

    metric: str
    real: m.Distribution
    sim: m.Distribution
    errors: tuple[m.StatError, ...]
    per_request: m.ErrorSummary | None
    """None for metrics not defined per request on both sides (ITL)."""
    available_sim: bool = True
    """False when the simulated side does not produce this metric at all."""


@dataclass(frozen=True)
class Trend:
    """How a metric's per-request |error| moves with a request length."""

    metric: str
    length: str
    """``prompt`` or ``output`` (tokens)."""
    spearman_rho: float


@dataclass(frozen=True)
class Comparison:
    """Everything the compare stage reports."""

    joined: m.JoinedRequests
    excluded: tuple[Excluded, ...]
    metrics: tuple[MetricComparison, ...]
    throughput_real: m.Throughput
    throughput_sim: m.Throughput
    trends: tuple[Trend, ...]
    per_request_errors: dict[str, np.ndarray] = field(repr=False)
    offered_qps: float

    def metric(self, name: str) -> MetricComparison:
        for item in self.metrics:
            if item.metric == name:
                return item
        raise KeyError(name)


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name not in frame.columns:
        return np.full(len(frame), np.nan)
    return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float)


def real_scheduling_delay_s(frame: pd.DataFrame) -> np.ndarray:
    """Engine arrival → first scheduled, on the engine's own stamps (hf_cb, vllm_engine); NaN
    where the backend has none."""
    return _column(frame, "engine_scheduled_time_s") - _column(frame, "engine_arrival_time_s")


def sim_scheduling_delay_s(frame: pd.DataFrame) -> np.ndarray:
    """The simulated engine-queued delay where the simulation wrote it
    (``engine_scheduling_delay_s``: from when vLLM's engine core would have queued the request,
    the wait for a running step left out, as the real side's stamps leave it), else Vidur's
    scheduling delay (an older simulation)."""
    if "engine_scheduling_delay_s" in frame.columns:
        return _column(frame, "engine_scheduling_delay_s")
    return _column(frame, "scheduling_delay_s")


def join_requests(
    real: pd.DataFrame, sim: pd.DataFrame, where: str = ""
) -> tuple[m.JoinedRequests, tuple[Excluded, ...]]:
    """Join ``request_metrics`` tables by ``request_id``; fail when lengths differ.

    The prompt lengths must match; the output length the real side was asked for
    (``expected_num_decode_tokens`` when recorded) must match the simulated one.
    """
    r = real.set_index("request_id")
    s = sim.set_index("request_id")
    common = r.index.intersection(s.index).sort_values()
    if common.empty:
        raise ArtifactError(f"{where}: the two runs have no request id in common")
    rc, sc = r.loc[common], s.loc[common]
    expected = (
        rc["expected_num_decode_tokens"]
        if "expected_num_decode_tokens" in rc.columns
        else rc["num_decode_tokens"]
    )
    for label, real_len, sim_len in (
        ("num_prefill_tokens", rc["num_prefill_tokens"], sc["num_prefill_tokens"]),
        ("num_decode_tokens", pd.to_numeric(expected), sc["num_decode_tokens"]),
    ):
        diff = np.flatnonzero(real_len.to_numpy(dtype=float) != sim_len.to_numpy(dtype=float))
        if diff.size:
            rid = int(common[diff[0]])
            raise ArtifactError(
                f"{where}: request {rid} has {label}={int(real_len.iloc[diff[0]])} in the real run "
                f"but {int(sim_len.iloc[diff[0]])} in the simulated one ({diff.size} request(s) "
                "differ): these runs are not of the same workload"
            )
    only = r.index.symmetric_difference(s.index)
    ok = (rc["status"].astype(str) == "ok").to_numpy() & (
        sc["status"].astype(str) == "ok"
    ).to_numpy()
    # statuses of every excluded request at once ("absent" on the side that lacks it)
    left_out = only.append(common[~ok])
    real_status = r["status"].astype(str).reindex(left_out).fillna("absent").tolist()
    sim_status = s["status"].astype(str).reindex(left_out).fillna("absent").tolist()
    excluded = [
        Excluded(int(rid), real, simulated)
        for rid, real, simulated in zip(left_out.tolist(), real_status, sim_status, strict=True)
    ]
    rc, sc = rc[ok], sc[ok]
    decode = sc["num_decode_tokens"].to_numpy(dtype=np.int64)

    def side(frame: pd.DataFrame, delay: np.ndarray) -> m.SideTimes:
        ttft, e2e = _column(frame, "ttft_s"), _column(frame, "e2e_s")
        return m.SideTimes(
            arrival_time_s=_column(frame, "arrival_time_s"),
            ttft_s=ttft,
            tpot_s=latency.tpot_s(ttft, e2e, decode),
            e2e_s=e2e,
            scheduling_delay_s=delay,
        )

    joined = m.JoinedRequests(
        request_id=rc.index.to_numpy(dtype=np.int64),
        num_prefill_tokens=rc["num_prefill_tokens"].to_numpy(dtype=np.int64),
        num_decode_tokens=decode,
        real=side(rc, real_scheduling_delay_s(rc)),
        sim=side(sc, sim_scheduling_delay_s(sc)),
    )
    return joined, tuple(sorted(excluded, key=lambda e: e.request_id))


def compare(
    joined: m.JoinedRequests,
    excluded: tuple[Excluded, ...],
    real_itl_s: np.ndarray,
    since_s: float = 0.0,
) -> Comparison:
    """Distributions, relative errors, per-request errors, throughput (over ``since_s`` → the
    last token: time 0, or the end of a warm-up left out) and length trends."""
    if len(joined) == 0:
        raise ArtifactError("no request completed on both sides: nothing to compare")
    per_request = {
        name: m.per_request_errors(joined.sim.metric(name), joined.real.metric(name))
        for name in m.PER_REQUEST_METRICS
    }
    items = []
    for name in m.METRICS:
        real = m.distribution(real_itl_s if name == "itl" else joined.real.metric(name))
        sim = m.distribution([]) if name == "itl" else m.distribution(joined.sim.metric(name))
        available = name != "itl" and sim.count > 0
        items.append(
            MetricComparison(
                metric=name,
                real=real,
                sim=sim,
                errors=m.compare_distributions(real, sim),
                per_request=m.error_summary(per_request[name]) if name in per_request else None,
                available_sim=available,
            )
        )
    lengths = {"prompt": joined.num_prefill_tokens, "output": joined.num_decode_tokens}
    trends = tuple(
        Trend(name, label, m.spearman(values, np.abs(per_request[name])))
        for name in m.PER_REQUEST_METRICS
        for label, values in lengths.items()
    )
    return Comparison(
        joined=joined,
        excluded=excluded,
        metrics=tuple(items),
        throughput_real=m.throughput(
            joined.real.arrival_time_s, joined.real.e2e_s, joined.num_decode_tokens, since_s
        ),
        throughput_sim=m.throughput(
            joined.sim.arrival_time_s, joined.sim.e2e_s, joined.num_decode_tokens, since_s
        ),
        trends=trends,
        per_request_errors=per_request,
        offered_qps=m.offered_qps(joined.real.arrival_time_s),
    )


def _how_far(error: float) -> str:
    """``23% low``, ``40% high``; as a factor beyond ±100% (``4.7x too low``)."""
    if error <= -0.5:
        return f"{1 / (1 + error):.1f}x too low" if error > -1 else "0 (100% low)"
    if error >= 1:
        return f"{1 + error:.1f}x too high"
    return f"{abs(error):.0%} {'high' if error > 0 else 'low'}"


def _ms(seconds: float) -> str:
    """Milliseconds to one decimal, two under a millisecond (0.05, not 0.1)."""
    ms = seconds * 1e3
    return f"{ms:.2f}" if abs(ms) < 1 else f"{ms:.1f}"


def ttft_p50_of(comparison: Comparison) -> float:
    """The measured TTFT p50 (s; NaN without one): the yardstick of a TTFT part's gap."""
    return next((i.real.p50 for i in comparison.metrics if i.metric == "ttft"), np.nan)


def small_gap_s(item: MetricComparison, ttft_p50_s: float) -> float | None:
    """A metric beyond ±:data:`NOTABLE_ERROR` at p50, p90 or p99 whose gap is too small to read
    as a ratio (under :data:`NOTABLE_GAP_S`, or a TTFT part's under :data:`TTFT_SHARE` of the
    measured TTFT p50): its largest gap in seconds, said in ms, not as a percent (0.03 against
    0.00 ms is -100%); None otherwise."""
    errors = {e.stat: e for e in item.errors}
    worst = max(abs(errors[s].signed_rel_error) for s in ("p50", "p90", "p99"))
    if not np.isfinite(worst) or worst < NOTABLE_ERROR:
        return None
    gap_s = max(abs(errors[s].sim_s - errors[s].real_s) for s in ("p50", "p90", "p99"))
    share_s = TTFT_SHARE * ttft_p50_s if item.metric in TTFT_PARTS else np.nan
    return float(gap_s) if gap_s < NOTABLE_GAP_S or gap_s < share_s else None


def discrepancies(
    comparison: Comparison, knob_mismatches: Mapping[str, Any] | None = None
) -> list[str]:
    """Plain-language findings computed from the numbers (largest errors first)."""
    lines: list[str] = []
    scored: list[tuple[float, str]] = []
    small: list[str] = []  # beyond ±10% but a gap too small to matter: said after the rest
    ttft_p50_s = ttft_p50_of(comparison)
    for item in comparison.metrics:
        if not item.available_sim:
            continue
        errors = {e.stat: e for e in item.errors}
        worst = max(abs(errors[s].signed_rel_error) for s in ("p50", "p90", "p99"))
        if not np.isfinite(worst) or worst < NOTABLE_ERROR:
            continue
        p90 = errors["p90"]
        gap_s = small_gap_s(item, ttft_p50_s)
        if gap_s is not None:
            within = (
                f"{NOTABLE_GAP_S * 1e3:g} ms"
                if gap_s < NOTABLE_GAP_S
                else f"{gap_s * 1e3:.2f} ms, under {TTFT_SHARE:.0%} of the measured TTFT p50 "
                f"({ttft_p50_s * 1e3:.1f} ms),"
            )
            small.append(
                f"simulated {m.METRIC_LABELS[item.metric]} within {within} of the measurement at "
                f"p50/p90/p99 (p90 {p90.sim_s * 1e3:.2f} ms vs {p90.real_s * 1e3:.2f} ms "
                "measured): too small to read as a ratio"
            )
            continue
        scored.append(
            (
                worst,
                f"simulated {m.METRIC_LABELS[item.metric]} p90 is {_how_far(p90.signed_rel_error)} "
                f"({_ms(p90.sim_s)} ms vs {_ms(p90.real_s)} ms measured; p50 "
                f"{errors['p50'].signed_rel_error:+.0%}, "
                f"p99 {errors['p99'].signed_rel_error:+.0%})",
            )
        )
    lines += [text for _, text in sorted(scored, key=lambda pair: -pair[0])]
    if not scored:
        lines.append(
            f"every p50/p90/p99 of TTFT, TPOT, E2E is within ±{NOTABLE_ERROR:.0%} "
            "of the measurement"
        )
    lines += small
    for trend in comparison.trends:
        if np.isfinite(trend.spearman_rho) and abs(trend.spearman_rho) >= TREND_MIN_RHO:
            verb = "grows" if trend.spearman_rho > 0 else "shrinks"
            lines.append(
                f"the per-request {m.METRIC_LABELS[trend.metric]} gap {verb} with {trend.length} "
                f"length (Spearman ρ = {trend.spearman_rho:+.2f})"
            )
    real_tp, sim_tp = comparison.throughput_real, comparison.throughput_sim
    tp_err = m.relative_error(sim_tp.output_tokens_per_s, real_tp.output_tokens_per_s)
    if np.isfinite(tp_err):
        lines.append(
            f"simulated output throughput is {sim_tp.output_tokens_per_s:.1f} tok/s vs "
            f"{real_tp.output_tokens_per_s:.1f} measured ({tp_err:+.0%})"
        )
    if comparison.excluded:
        statuses = sorted({f"{e.real_status}/{e.sim_status}" for e in comparison.excluded})
        lines.append(
            f"{len(comparison.excluded)} request(s) not ok on both sides were left out "
            f"(real/simulated status: {', '.join(statuses)}); the rest are compared"
        )
    for knob, pair in (knob_mismatches or {}).items():
        lines.append(f"engine knobs differ: {knob} (real {pair[0]}, simulated {pair[1]})")
    return lines
