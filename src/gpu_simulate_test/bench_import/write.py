"""An :class:`ImportedRun` as our own runs: the ``workload`` run it implies (lengths and arrival
times, random prompts of those lengths) and the ``real_bench`` run it measured, through the
shared writers and schemas (nothing copied from the stages that write them natively)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.bench_import.export import vllm_result
from gpu_simulate_test.bench_import.imported import ImportedRun, per_request_tpot_s
from gpu_simulate_test.config.schema import ModelConfig, WorkloadConfig
from gpu_simulate_test.core.host.disturbance import NOT_JUDGED
from gpu_simulate_test.core.traffic.workloads import Workload, write_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import write_csv, write_json
from gpu_simulate_test.io.runs import Run
from gpu_simulate_test.io.schemas import REQUEST_METRICS, TOKEN_METRICS

METRIC_CONVENTIONS = (
    "vllm bench serve: TTFT includes queueing; TPOT excludes the first token; ITL pools every "
    "inter-event gap; times as the importing tool's client observed them"
)


def request_order(run: ImportedRun) -> np.ndarray:
    """The successful requests' positions in the file, by send time (our request ids)."""
    ok = np.flatnonzero(run.ok)
    return ok[np.argsort(run.send_time_s[ok], kind="stable")]


def as_workload(run: ImportedRun) -> Workload:
    """Lengths and arrivals (send times from the first send) of the successful requests."""
    order = request_order(run)
    sent = run.send_time_s[order]
    return Workload(
        num_prefill_tokens=run.num_prefill_tokens[order],
        num_decode_tokens=run.num_decode_tokens[order],
        arrival_time_s=sent - sent[0],
    )


def write_imported_workload(
    out: Run, run: ImportedRun, model: ModelConfig, seed: int
) -> dict[str, Any]:
    """The workload run: its four artifacts, prompts random token ids of the imported lengths."""
    workload = as_workload(run)
    cfg = WorkloadConfig(
        source="trace", trace_file=str(run.source), num_requests=workload.num_requests, seed=seed
    )
    notes = {
        "source": run.tool,
        "imported_from": str(run.source),
        "imported_label": run.label,
        "arrivals_from": f"{run.tool}: when each request was sent, from the first send",
        "left_out_failed_requests": int((~run.ok).sum()),
    }
    meta = write_workload(out, workload, cfg, model, notes, show_progress=False)
    out.update_meta(workload_id=meta["workload_id"], num_requests=workload.num_requests)
    return meta


def request_table(run: ImportedRun) -> pd.DataFrame:
    """``request_metrics`` of the successful requests (ids in send order), with the tool's
    scheduled send (``scheduled_arrival_time_s``) and each request's place in the file."""
    order = request_order(run)
    origin = run.send_time_s[order[0]]
    arrival = run.send_time_s[order] - origin
    ttft = run.ttft_s[order]
    e2e = run.e2e_s[order]
    events = [run.event_offsets_s[i] for i in order]
    return pd.DataFrame(
        {
            "request_id": np.arange(len(order)),
            "arrival_time_s": arrival,
            "num_prefill_tokens": run.num_prefill_tokens[order],
            "num_decode_tokens": run.num_decode_tokens[order],
            "ttft_s": ttft,
            "tpot_s": per_request_tpot_s(run)[order],
            "e2e_s": e2e,
            "status": "ok",
            "scheduled_arrival_time_s": run.scheduled_time_s[order] - origin,
            "first_token_time_s": arrival + ttft,
            "last_token_time_s": arrival + e2e,
            "error": "",
            "arrival_error_s": run.send_time_s[order] - run.scheduled_time_s[order],
            "expected_num_decode_tokens": run.num_decode_tokens[order],
            "num_events": [len(e) if len(e) else np.nan for e in events],
            "token_count_mismatch": False,
            "source_index": order,
        }
    )


def token_table(run: ImportedRun, requests: pd.DataFrame) -> pd.DataFrame | None:
    """``token_metrics``: one row per output event where the tool kept event times (None when
    it kept none). An event that carried several tokens (a streamed chunk) is given the
    remainder at the last event: the file says how many events, not which tokens each held."""
    rows: list[dict[str, Any]] = []
    for rid, index, arrival in zip(
        requests["request_id"], requests["source_index"], requests["arrival_time_s"], strict=True
    ):
        events = run.event_offsets_s[int(index)]
        if len(events) == 0:
            continue
        n_tokens = int(run.num_decode_tokens[int(index)])
        counts = np.ones(len(events), dtype=int)
        counts[-1] += n_tokens - len(events)
        token_index = np.cumsum(counts) - 1
        times = float(arrival) + events
        gaps = np.concatenate(([np.nan], np.diff(times)))
        rows.extend(
            {
                "request_id": int(rid),
                "token_index": int(token_index[k]),
                "time_s": float(times[k]),
                "itl_s": float(gaps[k]),
                "num_tokens": int(counts[k]),
            }
            for k in range(len(events))
        )
    return pd.DataFrame(rows) if rows else None


def file_date(run: ImportedRun) -> tuple[str | None, str]:
    """The benchmark's own date (``YYYYmmdd-HHMMSS``, as ``vllm bench serve`` writes it) and
    where it came from; ``None`` where the file has none (the import's clock then)."""
    date = run.settings.get("date")
    if not isinstance(date, str) or not date:
        return None, "the import's clock: the file has no date"
    if "start_time" in run.settings:
        return date, f"the {run.tool} file's start_time (UTC)"
    return date, f"the {run.tool} file's date"


def write_imported_truth(
    out: Run, run: ImportedRun, workload_dir: str, workload_id: str
) -> dict[str, Any]:
    """The real_bench run: request (and token) metrics, ``summary.json`` in vLLM's keys, and
    ``run_meta.json`` saying where it came from and which conventions the file confirmed."""
    requests = request_table(run)
    write_csv(out.file(layout.REQUEST_METRICS), requests, REQUEST_METRICS)
    tokens = token_table(run, requests)
    if tokens is not None:
        write_csv(out.file(layout.TOKEN_METRICS), tokens, TOKEN_METRICS)
    settings = dict(run.settings)
    date, date_from = file_date(run)
    summary = vllm_result(
        requests,
        tokens,
        header={
            "date": date,
            "backend": str(settings.get("backend") or run.tool),
            "label": run.label or None,
            "model_id": settings.get("model_id"),
            "tokenizer_id": settings.get("tokenizer_id"),
            "request_rate": settings.get("request_rate"),
            "burstiness": settings.get("burstiness"),
            "max_concurrency": settings.get("max_concurrency"),
        },
        # no pooled ITL without the tool's token times (GuideLLM keeps none)
        metrics=("ttft", "tpot", "itl", "e2el") if tokens is not None else ("ttft", "tpot", "e2el"),
        percentiles=(50, 90, 99),
    )
    summary["date_from"] = date_from
    summary["metric_conventions"] = METRIC_CONVENTIONS
    summary["workload_id"] = workload_id
    write_json(out.file("summary.json"), summary)
    imported: Mapping[str, Any] = {
        "tool": run.tool,
        "source": str(run.source),
        "label": run.label,
        "settings": settings,
        "conventions": run.conventions,
        "left_out_failed_requests": int((~run.ok).sum()),
    }
    out.update_meta(
        workload_dir=workload_dir,
        workload_id=workload_id,
        num_requests=len(requests),
        backend={"name": run.tool, "imported": True},
        request_statuses={"ok": len(requests)},
        imported=dict(imported),
        disturbance={
            "disturbed": False,
            "reasons": [],
            "note": f"{NOT_JUDGED}imported from {run.tool}, which records no such signs",
        },
    )
    return summary
