"""Turn a :class:`Comparison` into tables, JSON and ``summary.md`` text (no file I/O here)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.comparison import Comparison, small_gap_s, ttft_p50_of
from gpu_simulate_test.compare.metrics import StatError
from gpu_simulate_test.core.reporting import markdown_table

HEADLINE_STATS: tuple[str, ...] = ("p50", "p90", "p99", "mean")


def _ms(value: float) -> float:
    return value * 1e3 if np.isfinite(value) else float("nan")


def percentile_frame(comparison: Comparison) -> pd.DataFrame:
    """The ``comparison_percentiles`` table: one row per metric and statistic, in ms."""
    rows = []
    for item in comparison.metrics:
        for err in item.errors:
            rows.append(
                {
                    "metric": item.metric,
                    "stat": err.stat,
                    "real_ms": _ms(err.real_s),
                    "sim_ms": _ms(err.sim_s),
                    "signed_rel_error": err.signed_rel_error,
                    "abs_rel_error": err.abs_rel_error,
                }
            )
    return pd.DataFrame(rows)


def requests_frame(comparison: Comparison) -> pd.DataFrame:
    """The ``comparison_requests`` table: joined requests with per-request errors."""
    joined = comparison.joined
    data: dict[str, Any] = {
        "request_id": joined.request_id,
        "num_prefill_tokens": joined.num_prefill_tokens,
        "num_decode_tokens": joined.num_decode_tokens,
    }
    for metric in ("ttft", "tpot", "e2e", "scheduling_delay"):
        data[f"real_{metric}_s"] = joined.real.metric(metric)
        data[f"sim_{metric}_s"] = joined.sim.metric(metric)
    for metric, errors in comparison.per_request_errors.items():
        data[f"{metric}_rel_error"] = errors
    return pd.DataFrame(data)


def to_dict(
    comparison: Comparison, setup: Mapping[str, Any], findings: Sequence[str]
) -> dict[str, Any]:
    """Every number of the comparison (times in seconds), for ``comparison.json``."""
    return {
        "conventions": {
            "relative_error": "sim / real - 1 (positive: simulated slower than measured)",
            "ttft": "arrival to first token, queueing included",
            "tpot": "(e2e - ttft) / (output tokens - 1); requests with 1 output token excluded",
            "itl": "every inter-token gap pooled (real side only; Vidur has no per-token times)",
            "throughput": "ok requests (output tokens) / (time 0 to last token)",
            "units": "seconds unless the key says otherwise",
        },
        "setup": dict(setup),
        "num_compared": len(comparison.joined),
        "offered_qps": comparison.offered_qps,
        "excluded": [dataclasses.asdict(e) for e in comparison.excluded],
        "metrics": {
            item.metric: {
                "real": dataclasses.asdict(item.real),
                "sim": dataclasses.asdict(item.sim) if item.available_sim else None,
                "errors": {
                    e.stat: {"signed": e.signed_rel_error, "absolute": e.abs_rel_error}
                    for e in item.errors
                },
                "per_request_error": (
                    dataclasses.asdict(item.per_request) if item.per_request else None
                ),
            }
            for item in comparison.metrics
        },
        "throughput": {
            "real": dataclasses.asdict(comparison.throughput_real),
            "sim": dataclasses.asdict(comparison.throughput_sim),
        },
        "trends": [dataclasses.asdict(t) for t in comparison.trends],
        "findings": list(findings),
    }


def _fmt_ms(value: float) -> str:
    return f"{value * 1e3:.2f}" if np.isfinite(value) else "–"


def _fmt_pct(value: float) -> str:
    return f"{value:+.1%}" if np.isfinite(value) else "–"


def headline_rows(comparison: Comparison) -> list[list[str]]:
    """Rows of the terminal table: metric, statistic, real ms, simulated ms, error."""
    rows = []
    for item in comparison.metrics:
        for err in item.errors:
            if err.stat in HEADLINE_STATS:
                rows.append(
                    [
                        m.METRIC_LABELS[item.metric],
                        err.stat,
                        _fmt_ms(err.real_s),
                        _fmt_ms(err.sim_s) if item.available_sim else "n/a",
                        _fmt_pct(err.signed_rel_error),
                    ]
                )
    return rows


def _knobs(values: Mapping[str, Any] | None) -> str:
    if not values:
        return "–"
    return ", ".join(f"`{k}={v}`" for k, v in sorted(values.items()))


def summary_markdown(
    comparison: Comparison,
    setup: Mapping[str, Any],
    findings: Sequence[str],
    plots: Mapping[str, str],
    verdict: Sequence[str] = (),
) -> str:
    """``summary.md``: the verdict's lines (first), setup, discrepancies, tables, throughput
    and embedded plots."""
    real = setup["real"]
    out = [
        f"# Real vs simulated: {real.get('model')} on {real.get('hardware')}",
        "",
        *verdict,
        f"Workload `{setup['workload_id']}`: {len(comparison.joined)} requests compared, "
        f"{len(comparison.excluded)} left out as not ok on both sides; offered load "
        f"{comparison.offered_qps:.2f} req/s.",
        "",
        *_setup_section(setup),
        "## Discrepancies",
        "",
        *[f"- {line}" for line in findings],
        "",
        *_latency_section(comparison),
        *_per_request_section(comparison),
        *_throughput_section(comparison),
    ]
    if comparison.excluded:
        out += [
            "## Left out",
            "",
            markdown_table(
                ["request", "real status", "simulated status"],
                [[str(e.request_id), e.real_status, e.sim_status] for e in comparison.excluded],
            ),
            "",
        ]
    if plots:
        out += ["## Plots", ""]
        out += [f"![{title}]({name})\n" for title, name in plots.items()]
    return "\n".join(out)


def _setup_section(setup: Mapping[str, Any]) -> list[str]:
    """``## Setup``: both runs side by side."""
    real, sim = setup["real"], setup["sim"]
    # a run bench_import wrote: the host and packages recorded are the importing machine's
    unknown = f"not recorded ({real.get('backend')})" if real.get("imported") else None
    return [
        "## Setup",
        "",
        markdown_table(
            ["", "real", "simulated (Vidur)"],
            [
                ["run", f"`{real['run_dir']}`", f"`{sim['run_dir']}`"],
                ["model", str(real.get("model")), str(sim.get("model"))],
                [
                    "device",
                    unknown
                    or f"{real.get('hardware')} ({real.get('device')}, {real.get('device_name')})",
                    f"{sim.get('hardware')} (Vidur device {sim.get('vidur_device')})",
                ],
                ["dtype", str(real.get("dtype")), f"{sim.get('dtype')} (profiling bundle)"],
                [
                    "engine",
                    f"backend `{real.get('backend')}`: {_knobs(real.get('backend_knobs'))}",
                    f"scheduler: {_knobs(sim.get('scheduler'))}; num_blocks used "
                    f"{sim.get('num_blocks')}",
                ],
                [
                    "versions",
                    unknown
                    or f"torch {real.get('torch')}, transformers {real.get('transformers')}",
                    f"vidur {sim.get('vidur_version')}",
                ],
                [
                    "bundle",
                    "–",
                    f"`{sim.get('bundle')}` (predictor {sim.get('predictor_fingerprint')})",
                ],
            ],
        ),
        "",
    ]


def _error_cell(e: StatError, small: bool) -> str:
    """A statistic's error: a percent, or where the metric's gap is too small to read as a ratio
    (:func:`~.comparison.small_gap_s`) the gap in ms ("-0.03 ms", not "-100.0%")."""
    return f"{(e.sim_s - e.real_s) * 1e3:+.2f} ms" if small else _fmt_pct(e.signed_rel_error)


def _latency_section(comparison: Comparison) -> list[str]:
    """``## Latency``: every statistic of every metric, real and simulated, and the errors (a
    metric too small to read as a ratio: its gaps in ms, and out of the absolute errors' line)."""
    ttft_p50_s = ttft_p50_of(comparison)
    small = {i.metric for i in comparison.metrics if small_gap_s(i, ttft_p50_s) is not None}
    in_ms = "; ".join(f"{m.METRIC_LABELS[x]} in ms (too small a gap for a ratio)" for x in small)
    return [
        "## Latency (ms); error = simulated / real − 1",
        "",
        markdown_table(
            [
                "metric",
                *[f"{s} real" for s in m.STATS],
                *[f"{s} sim" for s in m.STATS],
                "p50 err",
                "p90 err",
                "p99 err",
            ],
            [
                [
                    m.METRIC_LABELS[item.metric],
                    *[_fmt_ms(e.real_s) for e in item.errors],
                    *[_fmt_ms(e.sim_s) if item.available_sim else "n/a" for e in item.errors],
                    *[
                        _error_cell(e, item.metric in small)
                        for e in item.errors
                        if e.stat in ("p50", "p90", "p99")
                    ],
                ]
                for item in comparison.metrics
            ],
        ),
        "",
        "Absolute relative errors (p50 / p90 / p95 / p99 / mean): "
        + "; ".join(
            f"{m.METRIC_LABELS[item.metric]} "
            + " / ".join(f"{e.abs_rel_error:.1%}" for e in item.errors)
            for item in comparison.metrics
            if item.available_sim and item.metric not in small
        )
        + (f"; {in_ms}" if in_ms else "")
        + ". ITL: real side only (Vidur has no per-token times). Scheduling delay: the engine's "
        "arrival to first scheduled (its own stamps: vLLM with the engine's clock, vllm_engine, "
        "hf_cb; n/a for a backend without them).",
        "",
    ]


PER_REQUEST_HEAD = ("metric", "n", "mean", "p10", "p50", "p90", "mean abs", "p90 abs")


def _per_request_section(comparison: Comparison) -> list[str]:
    """``## Per-request error``: the spread of each request's error, per metric."""
    return [
        "## Per-request error (simulated / real − 1)",
        "",
        markdown_table(
            [*PER_REQUEST_HEAD, "requests within ±10%", "within ±25%"],
            [
                [
                    m.METRIC_LABELS[item.metric],
                    str(item.per_request.count),
                    *[
                        _fmt_pct(getattr(item.per_request, k))
                        for k in ("mean", "p10", "p50", "p90")
                    ],
                    *[
                        f"{getattr(item.per_request, k):.1%}"
                        for k in ("mean_abs", "p90_abs", "within_10pct", "within_25pct")
                    ],
                ]
                for item in comparison.metrics
                if item.per_request is not None
            ],
        ),
        "",
    ]


def _throughput_section(comparison: Comparison) -> list[str]:
    """``## Throughput``: requests and output tokens per second, real and simulated."""
    return [
        "## Throughput",
        "",
        markdown_table(
            ["", "requests", "output tokens", "duration (s)", "requests/s", "output tokens/s"],
            [
                [
                    label,
                    str(tp.num_requests),
                    str(tp.output_tokens),
                    f"{tp.duration_s:.2f}",
                    f"{tp.requests_per_s:.3f}",
                    f"{tp.output_tokens_per_s:.1f}",
                ]
                for label, tp in (
                    ("real", comparison.throughput_real),
                    ("simulated", comparison.throughput_sim),
                )
            ],
        ),
        "",
    ]
