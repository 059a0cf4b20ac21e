"""The torch_profiler step: serve the requests under ``torch.profiler``; tables, trace, MFU/MBU."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from gpu_simulate_test.config.deep_profile import DeepProfileStageConfig, TorchProfilerStep
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.deep_profile import contract as files
from gpu_simulate_test.deep_profile.engine import nvtx_for, serve_requests
from gpu_simulate_test.deep_profile.inputs import ProfileInputs, warmup_requests
from gpu_simulate_test.deep_profile.metrics import (
    StepTiming,
    phase_metrics,
    serving_summary,
)
from gpu_simulate_test.deep_profile.peaks import flop_peak_basis, host_peaks
from gpu_simulate_test.deep_profile.report import (
    operators_markdown,
    torch_profiler_report,
)
from gpu_simulate_test.io.artifacts import write_csv, write_json

PHASES: tuple[str, ...] = ("prefill", "decode")


def resolve_activities(
    requested: Sequence[str], device: str, cuda_available: bool
) -> tuple[list[str], list[str]]:
    """The activities that can be profiled here, and a note for each one dropped."""
    chosen: list[str] = []
    notes: list[str] = []
    for activity in requested:
        if activity == "cuda" and not device.startswith("cuda"):
            notes.append(f"cuda activity dropped: hardware.device={device} (not a GPU run)")
        elif activity == "cuda" and not cuda_available:
            notes.append("cuda activity dropped: torch.cuda.is_available() is False")
        elif activity not in chosen:
            chosen.append(activity)
    if not chosen:
        chosen = ["cpu"]
        notes.append("no requested activity is available; profiling cpu")
    return chosen, notes


def _us_to_ms(value: Any) -> float:
    return float(value or 0.0) / 1e3


def operator_rows(events: Iterable[Any]) -> list[dict[str, Any]]:
    """One row per operator name of ``key_averages()``: calls, self/total CPU and device time
    (ms), shares. Entries sharing a name are merged (times summed, calls the larger count).

    On CUDA a ``record_function`` range (``prefill``, ``decode``) comes back twice under one
    key: its CPU event and its GPU-side user annotation, whose "self" device time is the whole
    range's span, the kernels inside it counted a second time (pytorch/pytorch#130730). A user
    annotation therefore adds no self device time; its device total is the larger of its span
    and the summed time of the kernels it launched. Shares are of the summed self time of every
    operator, so they add up to 100 %.
    """
    merged: dict[str, dict[str, Any]] = {}
    spans: dict[str, float] = {}
    for e in events:
        key = str(e.key)
        row = merged.setdefault(
            key,
            {
                "operator": key,
                "calls": 0,
                "self_cpu_time_ms": 0.0,
                "cpu_total_time_ms": 0.0,
                "self_device_time_ms": 0.0,
                "device_total_time_ms": 0.0,
            },
        )
        row["calls"] = max(row["calls"], int(e.count))
        row["self_cpu_time_ms"] += _us_to_ms(e.self_cpu_time_total)
        row["cpu_total_time_ms"] += _us_to_ms(e.cpu_time_total)
        device_total = _us_to_ms(getattr(e, "device_time_total", 0.0))
        if getattr(e, "is_user_annotation", False):
            spans[key] = max(spans.get(key, 0.0), device_total)
            continue
        row["self_device_time_ms"] += _us_to_ms(getattr(e, "self_device_time_total", 0.0))
        row["device_total_time_ms"] += device_total
    for key, span in spans.items():
        merged[key]["device_total_time_ms"] = max(merged[key]["device_total_time_ms"], span)
    rows = list(merged.values())
    cpu_total = sum(r["self_cpu_time_ms"] for r in rows)
    device_total = sum(r["self_device_time_ms"] for r in rows)
    for r in rows:
        r["self_cpu_share_pct"] = 100 * r["self_cpu_time_ms"] / cpu_total if cpu_total else 0.0
        r["self_device_share_pct"] = (
            100 * r["self_device_time_ms"] / device_total if device_total else 0.0
        )
    return rows


def sort_key(option: str, activities: Sequence[str]) -> str:
    """``self_device_time_ms`` or ``self_cpu_time_ms``, per ``sort_by`` and what was profiled."""
    if option == "device" or (option == "auto" and "cuda" in activities):
        return "self_device_time_ms"
    return "self_cpu_time_ms"


def top_operators(rows: Sequence[dict[str, Any]], key: str, n: int) -> list[dict[str, Any]]:
    """The ``n`` rows with the largest ``key`` (ties by name)."""
    return sorted(rows, key=lambda r: (-r[key], r["operator"]))[:n]


@contextlib.contextmanager
def passes_progress(enabled: bool) -> Iterator[Callable[[str, int], Callable[[], None]]]:
    """Yield ``start(label, total)``, which adds a bar for one pass over the requests and
    returns its ``done()``; redrawn only by ``done()`` (no refresh thread beside the timed
    steps), nothing when not ``enabled``."""
    if not enabled:
        yield lambda _label, _total: lambda: None
        return
    with Progress(
        TextColumn("[bold]torch_profiler {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        auto_refresh=False,
    ) as progress:

        def start(label: str, total: int) -> Callable[[], None]:
            task = progress.add_task(label, total=total)
            progress.refresh()

            def done() -> None:
                progress.advance(task)
                progress.refresh()

            return done

        yield start


def _profile(
    model: Any,
    inputs: ProfileInputs,
    cfg: DeepProfileStageConfig,
    activities: Sequence[str],
    opts: TorchProfilerStep,
    done: Callable[[], None],
) -> tuple[Any, list[StepTiming]]:
    from torch.profiler import ProfilerActivity, profile

    kinds = [ProfilerActivity.CPU if a == "cpu" else ProfilerActivity.CUDA for a in activities]
    with profile(
        activities=kinds,
        record_shapes=opts.record_shapes,
        profile_memory=opts.profile_memory,
        with_stack=opts.with_stack,
    ) as prof:
        steps = serve_requests(
            model,
            inputs.requests,
            cfg.model,
            device=cfg.hardware.device,
            dtype=cfg.dtype,
            nvtx=nvtx_for(cfg.hardware.device),
            done=done,
        )
    return prof, steps


def run_torch_profiler(
    cfg: DeepProfileStageConfig, model: Any, inputs: ProfileInputs, out: Path
) -> dict[str, Any]:
    """Warm up, time (optionally without the profiler), profile; write the step's artifacts.

    Returns ``metrics.json``'s content (the stage report reads it).
    """
    import torch

    opts = cfg.pipeline.torch_profiler
    device = cfg.hardware.device
    activities, notes = resolve_activities(opts.activities, device, torch.cuda.is_available())
    warmups = warmup_requests(inputs.requests, opts.num_warmup_requests, cfg.model.vocab_size)
    timed: list[StepTiming] | None = None
    with passes_progress(cfg.progress) as start:
        done = start("warm-up", len(warmups))
        serve_requests(model, warmups, cfg.model, device=device, dtype=cfg.dtype, done=done)
        if opts.timing_pass:
            done = start("timed pass", len(inputs.requests))
            timed = serve_requests(
                model, inputs.requests, cfg.model, device=device, dtype=cfg.dtype, done=done
            )
        done = start("profiled pass", len(inputs.requests))
        prof, profiled = _profile(model, inputs, cfg, activities, opts, done)
    steps = timed if timed is not None else profiled
    if timed is None:
        notes.append("timings come from the profiled pass (timing_pass=false): profiler overhead")

    out.mkdir(parents=True, exist_ok=True)
    rows = operator_rows(prof.key_averages())
    key = sort_key(opts.sort_by, activities)
    ranked = top_operators(rows, key, len(rows))
    write_csv(out / files.OPERATORS_CSV, pd.DataFrame(ranked), files.OPERATORS)
    (out / files.OPERATORS_MD).write_text(
        operators_markdown(ranked, key, opts.top_n, activities), encoding="utf-8"
    )
    if opts.chrome_trace:
        prof.export_chrome_trace(str(out / files.TRACE))
    write_csv(
        out / files.STEP_TIMINGS_CSV,
        pd.DataFrame([s.to_dict() for s in steps]),
        files.STEP_TIMINGS,
    )
    hardware, peaks = host_peaks(cfg.hardware)  # a CPU's config peaks are guesses: measured
    if peaks["source"] == "measured":
        notes.append(
            f"CPU peaks measured on this host: {hardware.memory_bandwidth_gb_s:.1f} GB/s copy "
            f"bandwidth, {hardware.peak_bf16_tflops:.3f} TFLOP/s fp32 matmul ({peaks['threads']} "
            f"threads; the config says {cfg.hardware.memory_bandwidth_gb_s:g} GB/s, "
            f"{cfg.hardware.peak_bf16_tflops:g} TFLOP/s); MFU and MBU use the measured ones"
        )
    phases = {
        phase: m.to_dict()
        for phase in PHASES
        if (m := phase_metrics(steps, phase, hardware)) is not None
    }
    metrics: dict[str, Any] = {
        "schema_version": "1.0",
        "hardware": {
            "name": cfg.hardware.name,
            "device": device,
            "peak_bf16_tflops": hardware.peak_bf16_tflops,
            "peak_tflops_basis": flop_peak_basis(peaks),
            "memory_bandwidth_gb_s": hardware.memory_bandwidth_gb_s,
            "peaks": peaks,
        },
        "activities": activities,
        "notes": notes,
        "timings_from": "timing_pass" if timed is not None else "profiled_pass",
        "sort_key": key,
        "phases": phases,
        "serving": serving_summary(steps),
        "top_operators": top_operators(rows, key, opts.top_n),
        "conventions": {
            "mfu": "analytic FLOPs / (measured time x hardware.peak_bf16_tflops; on a CPU the "
            "probe's matmul rate)",
            "mbu": "analytic bytes moved / (measured time x hardware.memory_bandwidth_gb_s; on a "
            "CPU the probe's copy bandwidth); above 1 when weights sit in cache",
            "ttft": "prefill step time, one request at a time (no queueing)",
            "tpot": "mean decode step time per request, first token excluded",
        },
    }
    write_json(out / files.METRICS, metrics)
    (out / files.REPORT).write_text(torch_profiler_report(metrics), encoding="utf-8")
    return metrics
