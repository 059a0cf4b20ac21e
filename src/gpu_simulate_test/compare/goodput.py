"""Goodput on both sides of a comparison, as ``vllm bench serve --goodput`` counts it: the
requests compared that met every goal (client clock, as vLLM's client measures), per second of
each side's own duration (time 0, or a warm-up's end, to its last token, as the throughput)."""

from __future__ import annotations

from typing import Any

from gpu_simulate_test.compare.comparison import Comparison
from gpu_simulate_test.core.metrics.goodput import GoodputConfig, goals_text, goodput


def compare_goodput(comparison: Comparison, goals: GoodputConfig) -> dict[str, Any] | None:
    """Real and simulated goodput of the joined requests and the error; None without goals."""
    sides = {}
    for name, times, tp in (
        ("real", comparison.joined.real, comparison.throughput_real),
        ("sim", comparison.joined.sim, comparison.throughput_sim),
    ):
        sides[name] = goodput(goals, times.ttft_s, times.tpot_s, times.e2e_s, tp.duration_s)
    real, sim = sides["real"], sides["sim"]
    if real is None or sim is None:
        return None
    rate_real, rate_sim = real["request_goodput"], sim["request_goodput"]
    return {
        "goals_ms": real["goals_ms"],
        "clock": "client",
        "real": {k: real[k] for k in ("good_requests", "request_goodput")},
        "sim": {k: sim[k] for k in ("good_requests", "request_goodput")},
        "error": rate_sim / rate_real - 1 if rate_real > 0 else None,
    }


def goodput_markdown(good: dict[str, Any] | None) -> str:
    """The summary's goodput section; empty without goals."""
    if not good:
        return ""
    goals = goals_text(good["goals_ms"])
    error = "–" if good["error"] is None else f"{good['error']:+.1%}"
    real, sim = good["real"], good["sim"]
    return (
        f"\n## Goodput\n\nRequests per second that met every goal (`--goodput {goals}`, ms, "
        "as `vllm bench serve` counts them, on the client's clock):\n\n"
        "| | good requests | request goodput (req/s) |\n| --- | --- | --- |\n"
        f"| real | {real['good_requests']} | {real['request_goodput']:.3f} |\n"
        f"| simulated | {sim['good_requests']} | {sim['request_goodput']:.3f} |\n\n"
        f"Error (simulated / real − 1): {error}.\n"
    )
