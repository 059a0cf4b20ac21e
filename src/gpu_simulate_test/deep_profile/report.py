"""Markdown for the deep_profile run: operator tables, the engineer report, the one-pager.

Pure string builders over the steps' JSON documents; nothing here reads or writes files.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from gpu_simulate_test.core.reporting import markdown_table as plain_markdown_table
from gpu_simulate_test.deep_profile.nsight.tools import StepOutcome
from gpu_simulate_test.deep_profile.peaks import flop_peak_basis


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 1e-3):
            return f"{value:.{digits}g}"
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _pct(value: float | None) -> str:
    return "–" if value is None or not math.isfinite(value) else f"{100 * value:.2f} %"


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; cells formatted with thousands separators and 3 digits."""
    cells = [[_fmt(c).replace("|", "\\|") for c in row] for row in rows]
    return plain_markdown_table(headers, cells) + "\n"


def _op_table(rows: Sequence[Mapping[str, Any]], top_n: int) -> str:
    return markdown_table(
        ["operator", "calls", "self CPU ms", "self CPU %", "self device ms", "self device %"],
        [
            [
                r["operator"],
                r["calls"],
                r["self_cpu_time_ms"],
                r["self_cpu_share_pct"],
                r["self_device_time_ms"],
                r["self_device_share_pct"],
            ]
            for r in rows[:top_n]
        ],
    )


def operators_markdown(
    ranked: Sequence[Mapping[str, Any]], key: str, top_n: int, activities: Sequence[str]
) -> str:
    """Top-N operators by ``key``, then the same N by calls."""
    by_calls = sorted(ranked, key=lambda r: (-r["calls"], r["operator"]))
    return (
        f"# Operators (torch.profiler, activities: {', '.join(activities)})\n\n"
        f"Top {top_n} by `{key}` (self time excludes children; shares are of all self time):\n\n"
        + _op_table(ranked, top_n)
        + f"\nTop {top_n} by calls:\n\n"
        + _op_table(by_calls, top_n)
    )


def _peaks_line(peaks: Any) -> str:
    """Where the roofline's peaks came from (measured on a CPU host, the config on a GPU)."""
    if not isinstance(peaks, dict):
        return ""
    where = "measured on this host" if peaks.get("source") == "measured" else "from the config"
    return (
        f"- roofline peaks ({where}): {peaks.get('peak_tflops', float('nan')):.3g} TFLOP/s, "
        f"{peaks.get('memory_bandwidth_gb_s', float('nan')):.3g} GB/s\n"
    )


def static_markdown(doc: Mapping[str, Any]) -> str:
    """Parameters, KV bytes/token and the per-step roofline table."""
    params = doc["parameters"]
    rows = [
        [
            r["phase"],
            r["batch_size"],
            r["new_tokens"],
            r["cached_tokens"],
            r["flops"] / 1e9,
            r["bytes_moved"] / 1e6,
            r["arithmetic_intensity_flop_per_byte"],
            r["bound_time_s"] * 1e3,
            r["bound"],
        ]
        for r in doc["steps"]
    ]
    return (
        f"# Static analysis: {doc['model']} on {doc['hardware']} ({doc['dtype']})\n\n"
        f"- parameters: {params['total']:,} ({params['per_layer']:,} per layer × "
        f"{params['num_layers']}, embedding {params['embedding']:,}, "
        f"final norm {params['final_norm']:,}, LM head {params['lm_head']:,})\n"
        f"- KV cache: {doc['kv_cache_bytes_per_token']:,} bytes/token\n"
        + _peaks_line(doc.get("peaks"))
        + "\n"
        + markdown_table(
            [
                "phase",
                "batch",
                "new tokens",
                "cached tokens",
                "GFLOP",
                "MB moved",
                "FLOP/B",
                "roofline ms",
                "bound",
            ],
            rows,
        )
    )


def _phase_rows(phases: Mapping[str, Mapping[str, Any]]) -> list[list[Any]]:
    return [
        [
            name,
            m["num_steps"],
            m["tokens"],
            m["time_s"] * 1e3,
            m["mean_step_ms"],
            m["achieved_tflops"],
            m["achieved_gb_s"],
            _pct(m["mfu"]),
            _pct(m["mbu"]),
            m["roofline_bound_time_s"] * 1e3,
            _pct(m["roofline_efficiency"]),
            m["bound"],
        ]
        for name, m in phases.items()
    ]


PHASE_HEADERS = (
    "phase",
    "steps",
    "tokens",
    "time ms",
    "mean step ms",
    "TFLOP/s",
    "GB/s",
    "MFU",
    "MBU",
    "roofline ms",
    "roofline eff.",
    "bound",
)


def torch_profiler_report(metrics: Mapping[str, Any]) -> str:
    """The torch_profiler step's own report: phases, serving numbers, top operators."""
    serving = metrics["serving"]
    notes = "".join(f"- {n}\n" for n in metrics["notes"])
    return (
        "# torch.profiler\n\n"
        f"Activities: {', '.join(metrics['activities'])}; timings from the "
        f"{metrics['timings_from'].replace('_', ' ')}.\n\n"
        + (f"Notes:\n\n{notes}\n" if notes else "")
        + markdown_table(PHASE_HEADERS, _phase_rows(metrics["phases"]))
        + f"\nRequests {serving['num_requests']}, output throughput "
        f"{_fmt(serving['output_throughput_tokens_per_s'])} tok/s, mean TTFT "
        f"{_fmt(serving['mean_ttft_ms'])} ms, mean TPOT {_fmt(serving['mean_tpot_ms'])} ms.\n\n"
        "Top operators (full tables in operators.md):\n\n" + _op_table(metrics["top_operators"], 10)
    )


def _status_table(outcomes: Sequence[StepOutcome]) -> str:
    return markdown_table(
        ["step", "status", "reason"], [[o.step, o.status, o.reason or ""] for o in outcomes]
    )


def stage_report(
    title: str,
    outcomes: Sequence[StepOutcome],
    static_doc: Mapping[str, Any] | None,
    torch_metrics: Mapping[str, Any] | None,
    nsight: Mapping[str, Mapping[str, Any]],
) -> str:
    """The engineer's view: step status, where time goes, MFU/MBU, roofline, kernels."""
    parts = [f"# Deep profile: {title}\n\n## Steps\n\n", _status_table(outcomes)]
    if torch_metrics:
        phases = torch_metrics["phases"]
        total = sum(m["time_s"] for m in phases.values()) or 1.0
        hardware = torch_metrics.get("hardware") or {}
        basis = hardware.get("peak_tflops_basis") or flop_peak_basis(hardware.get("peaks"))
        parts += [
            "\n## Where time goes\n\n",
            markdown_table(
                ["phase", "time ms", "share"],
                [[n, m["time_s"] * 1e3, _pct(m["time_s"] / total)] for n, m in phases.items()],
            ),
            "\n## MFU / MBU per phase\n\n",
            f"MFU = analytic FLOPs ÷ (time × {basis}); MBU = analytic bytes ÷ (time × "
            "memory bandwidth); roofline eff. = roofline-bound time ÷ measured time.\n\n",
            markdown_table(PHASE_HEADERS, _phase_rows(phases)),
            f"\n## Top operators (by `{torch_metrics['sort_key']}`)\n\n",
            _op_table(torch_metrics["top_operators"], 10),
        ]
        if torch_metrics["notes"]:
            parts.append("\n" + "".join(f"- {n}\n" for n in torch_metrics["notes"]))
    if static_doc:
        parts += [
            "\n## Roofline (static analysis)\n\n",
            static_markdown(static_doc).split("\n", 2)[2],
        ]
    for step, summary in nsight.items():
        kernels = summary.get("top_kernels") or summary.get("kernel_bounds") or []
        if kernels:
            parts += [
                f"\n## {step}: kernels\n\n",
                markdown_table(list(kernels[0].keys()), [list(k.values()) for k in kernels[:10]]),
            ]
    return "".join(parts)


def biggest_costs(torch_metrics: Mapping[str, Any] | None, n: int = 3) -> list[tuple[str, float]]:
    """The ``n`` operators with the largest share of self time (device when profiled)."""
    if not torch_metrics:
        return []
    share = (
        "self_device_share_pct"
        if torch_metrics["sort_key"] == "self_device_time_ms"
        else "self_cpu_share_pct"
    )
    # record_function labels (prefill/decode) wrap whole steps: not a cost of their own
    ops = [r for r in torch_metrics["top_operators"] if r["operator"] not in ("prefill", "decode")]
    return [(r["operator"], float(r[share])) for r in ops[:n]]


def stakeholder_summary(
    title: str,
    outcomes: Sequence[StepOutcome],
    torch_metrics: Mapping[str, Any] | None,
    hardware_name: str,
) -> str:
    """One page in plain words: speed, latency, how much of the hardware is used, top costs."""
    lines = [f"# {title}: summary\n"]
    if torch_metrics:
        s = torch_metrics["serving"]
        phases = torch_metrics["phases"]
        lines.append(
            f"- **Speed**: {_fmt(s['output_throughput_tokens_per_s'], 1)} generated tokens per "
            f"second, one request at a time ({s['num_requests']} requests).\n"
            f"- **Latency**: the first token takes {_fmt(s['mean_ttft_ms'], 1)} ms on average; "
            f"each further token {_fmt(s['mean_tpot_ms'], 1)} ms."
        )
        for name, m in phases.items():
            lines.append(
                f"- **{name.capitalize()} uses {_pct(m['mfu'])} of the {hardware_name}'s compute "
                f"and {_pct(m['mbu'])} of its memory bandwidth** (it is {m['bound']}-bound on "
                f"paper; it runs at {_pct(m['roofline_efficiency'])} of the fastest possible)."
            )
        costs = biggest_costs(torch_metrics)
        if costs:
            lines.append("\nThe three biggest costs (share of measured operator time):\n")
            lines += [f"{i}. `{op}`: {share:.1f} %" for i, (op, share) in enumerate(costs, 1)]
            lines.append("")
    elif any(o.step == "torch_profiler" for o in outcomes):
        lines.append("- The timed run (torch_profiler) did not complete: see below why.\n")
    else:
        lines.append("- The timed run (torch_profiler) was not part of this profile.\n")
    skipped = [o for o in outcomes if o.status != "ok"]
    if skipped:
        lines.append("\nNot done in this run:\n")
        lines += [f"- {o.step} ({o.status}): {o.reason}" for o in skipped]
    return "\n".join(lines) + "\n"
