"""Terminal output of the real bench: a live progress bar and the summary table."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpu_simulate_test.core.engines.harness import ProgressFn
from gpu_simulate_test.core.engines.records import Recorder
from gpu_simulate_test.core.metrics.goodput import goals_text
from gpu_simulate_test.core.reporting import console, print_table
from gpu_simulate_test.real_bench.metrics import PERCENTILES


@contextlib.contextmanager
def live_progress(total: int, enabled: bool) -> Iterator[ProgressFn | None]:
    """Yield a callback that redraws requests done and output tokens/s (None when disabled).

    Redraws happen only when the harness calls it (no refresh thread competing with the engine).
    """
    if not enabled:
        yield None
        return
    with Progress(
        TextColumn("[bold]replaying"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        console=console,
        auto_refresh=False,
        transient=False,
    ) as progress:
        task = progress.add_task("replay", total=total, rate="")
        started = time.perf_counter()

        def update(recorder: Recorder) -> None:
            elapsed = max(time.perf_counter() - started, 1e-9)
            progress.update(
                task,
                completed=recorder.num_done,
                rate=f"{recorder.num_tokens} tok, {recorder.num_tokens / elapsed:.1f} tok/s",
            )
            progress.refresh()

        yield update


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def print_summary(summary: Mapping[str, Any], title: str) -> None:
    """Throughput and TTFT/TPOT/ITL/E2E percentiles, like ``vllm bench serve`` prints them."""
    not_sent = summary.get("num_not_sent") or 0  # a closed loop's turns after a failed one
    rows = [
        ["requests ok / failed", f"{summary['completed']} / {summary['failed']}", "", "", ""],
        *([["requests not sent", str(not_sent), "", "", ""]] if not_sent else []),
        ["duration (s)", _fmt(summary["duration"]), "", "", ""],
        ["request throughput (req/s)", _fmt(summary["request_throughput"], 3), "", "", ""],
        *_goodput_rows(summary.get("goodput")),
        ["output throughput (tok/s)", _fmt(summary["output_throughput"]), "", "", ""],
        ["total token throughput (tok/s)", _fmt(summary["total_token_throughput"]), "", "", ""],
    ]
    for key, label in (
        ("ttft", "TTFT (ms)"),
        ("tpot", "TPOT (ms)"),
        ("itl", "ITL (ms)"),
        ("e2el", "E2E (ms)"),
    ):
        rows.append(
            [
                label,
                _fmt(summary[f"mean_{key}_ms"]),
                *(_fmt(summary[f"p{p}_{key}_ms"]) for p in PERCENTILES),
            ]
        )
    arrival = summary["arrival_error_ms"]
    rows.append(
        [
            "arrival error (ms)",
            _fmt(arrival["mean"], 3),
            *(_fmt(arrival[f"p{p}"], 3) for p in PERCENTILES),
        ]
    )
    print_table(title, ["", "mean / value", *(f"p{p}" for p in PERCENTILES)], rows)


def _goodput_rows(good: Mapping[str, Any] | None) -> list[list[str]]:
    """The goodput line, as ``vllm bench serve --goodput`` prints it; none without goals."""
    if not good:
        return []
    rate = _fmt(good["request_goodput"], 3)
    return [[f"request goodput (req/s; {goals_text(good['goals_ms'])} ms)", rate, "", "", ""]]
