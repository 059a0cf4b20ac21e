"""Read a ``vllm bench serve --save-result --save-detailed`` result as imported runs.

What the file holds per request (vLLM 0.32 ``benchmarks/serve.py`` and
``benchmarks/lib/endpoint_request_func.py``, read, not assumed; each is checked on the file):

- ``start_times``: ``time.perf_counter()`` when the request was sent (after the client's
  ``--max-concurrency`` semaphore); ``queue_times``: the wait in that semaphore before it;
- ``ttfts``: first streamed chunk − send, so the server's queueing is included and the
  client's semaphore wait is not;
- ``itls``: the gaps between consecutive streamed chunks (a chunk may carry several tokens),
  so TTFT + Σ ITL = ``latencies`` (last chunk − send);
- ``output_lens``: the server's ``completion_tokens``; TPOT = (latency − TTFT) / (output − 1)
  over requests with more than one token (the run's ``mean_tpot_ms``);
- a failed request has a non-empty ``errors`` entry and ``output_lens`` 0.

``--append-result`` puts several results in one file, one JSON object a line: each is a run.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gpu_simulate_test.bench_import.contract import VLLM_DETAILED_KEYS
from gpu_simulate_test.bench_import.imported import (
    Floats,
    ImportedRun,
    Ints,
    convention,
    per_request_tpot_s,
)
from gpu_simulate_test.io.artifacts import ArtifactError

TOOL = "vllm_bench_serve"
SETTINGS_KEYS: tuple[str, ...] = (
    "date",
    "backend",
    "label",
    "model_id",
    "tokenizer_id",
    "num_prompts",
    "request_rate",
    "burstiness",
    "max_concurrency",
    "duration",
)


def is_vllm_result(data: Any) -> bool:
    """Whether a parsed JSON value looks like a ``vllm bench serve`` result."""
    return isinstance(data, Mapping) and (
        "endpoint_type" in data or "mean_ttft_ms" in data or "ttfts" in data
    )


def load_results(path: Path) -> list[dict[str, Any]]:
    """The result objects of a file: one, or one per line (``--append-result``)."""
    text = path.read_text(encoding="utf-8")
    try:
        return [json.loads(text)]
    except json.JSONDecodeError as whole:
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) < 2:
            raise ArtifactError(f"{path}: not JSON ({whole}); expected a result file") from whole
        try:
            return [json.loads(line) for line in lines]
        except json.JSONDecodeError as exc:
            raise ArtifactError(f"{path}: not JSON ({exc}); expected a result file") from exc


def read_vllm_bench(path: Path, results: Sequence[Mapping[str, Any]]) -> list[ImportedRun]:
    """Every result in the file as a run (labelled ``result <k>`` when there are several)."""
    many = len(results) > 1
    return [
        parse_result(path, result, f"result {k}" if many else "")
        for k, result in enumerate(results)
    ]


def _list(path: Path, label: str, data: Mapping[str, Any], key: str, n: int | None) -> list:
    where = f"{path}{f' ({label})' if label else ''}"
    if key not in data:
        if key in VLLM_DETAILED_KEYS:
            raise ArtifactError(
                f"{where}: field {key!r} is missing: the result was saved without "
                "--save-detailed (only summaries, no per-request times); re-run "
                "`vllm bench serve --save-result --save-detailed`"
            )
        raise ArtifactError(f"{where}: field {key!r} is missing; expected a per-request list")
    values = data[key]
    if not isinstance(values, list) or (n is not None and len(values) != n):
        got = f"{len(values)} entries" if isinstance(values, list) else type(values).__name__
        raise ArtifactError(
            f"{where}: field {key!r} has {got}, expected a list of {n} (one per request, as "
            "'input_lens')"
        )
    return values


def _floats(where: str, key: str, values: Sequence[Any]) -> Floats:
    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ArtifactError(f"{where}: field {key!r} is not a list of numbers ({exc})") from exc


def _counts(where: str, key: str, values: Sequence[Any]) -> Ints:
    """A per-request token count list: whole numbers >= 0 (a failed request's may be 0)."""
    for i, value in enumerate(values):
        whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
        if isinstance(value, bool) or not whole or value < 0:
            raise ArtifactError(
                f"{where}: field '{key}[{i}]' is {value!r}, expected a token count (a whole "
                "number >= 0)"
            )
    return np.asarray(values, dtype=np.int64)


def parse_result(path: Path, data: Mapping[str, Any], label: str = "") -> ImportedRun:
    """One ``vllm bench serve`` result (a parsed JSON object) as an :class:`ImportedRun`."""
    where = f"{path}{f' ({label})' if label else ''}"
    if not is_vllm_result(data):
        raise ArtifactError(
            f"{where}: not a `vllm bench serve` result (no 'endpoint_type', 'mean_ttft_ms' or "
            "'ttfts'); expected the JSON of `vllm bench serve --save-result --save-detailed`"
        )
    input_lens = _counts(where, "input_lens", _list(path, label, data, "input_lens", None))
    n = len(input_lens)
    if n == 0:
        raise ArtifactError(f"{where}: field 'input_lens' is empty; no request to import")
    output_lens = _counts(where, "output_lens", _list(path, label, data, "output_lens", n))
    start = _floats(where, "start_times", _list(path, label, data, "start_times", n))
    ttft = _floats(where, "ttfts", _list(path, label, data, "ttfts", n))
    itls_raw = _list(path, label, data, "itls", n)
    saved = data.get("errors")
    if saved is not None and not isinstance(saved, list):  # a string's letters are no errors
        raise ArtifactError(
            f"{where}: field 'errors' is {type(saved).__name__}, expected a list of {n} (one "
            "per request, '' where it succeeded)"
        )
    errors = [str(e or "") for e in saved or [""] * n]
    if len(errors) != n:
        raise ArtifactError(f"{where}: field 'errors' has {len(errors)} entries, expected {n}")
    ok = np.array([e == "" for e in errors]) & (output_lens > 0)
    itls = [_floats(where, "itls", row if isinstance(row, list) else [row]) for row in itls_raw]
    sums = np.array([ttft[i] + float(gaps.sum()) for i, gaps in enumerate(itls)])
    if "latencies" in data:
        e2e = _floats(where, "latencies", _list(path, label, data, "latencies", n))
    else:
        e2e = sums  # vLLM before 0.10 saved no latencies: the last chunk is TTFT + every ITL
    queue = data.get("queue_times")
    queue_s = _floats(where, "queue_times", queue) if isinstance(queue, list) else np.zeros(n)
    if len(queue_s) != n:
        raise ArtifactError(
            f"{where}: field 'queue_times' has {len(queue_s)} entries, expected {n}"
        )
    events = tuple(
        np.concatenate(([ttft[i]], ttft[i] + np.cumsum(itls[i]))) if ok[i] else np.array([])
        for i in range(n)
    )
    run = ImportedRun(
        tool=TOOL,
        source=path,
        label=label,
        ok=ok,
        send_time_s=start,
        scheduled_time_s=start - queue_s,
        num_prefill_tokens=input_lens,
        num_decode_tokens=output_lens,
        ttft_s=ttft,
        e2e_s=e2e,
        event_offsets_s=events,
        errors=tuple(errors),
        settings={k: data.get(k) for k in SETTINGS_KEYS if k in data},
        # the checks' names for the file's lists (a result of vLLM < 0.10 has no latencies)
        fields={"ttft": "ttfts", "latency": "latencies" if "latencies" in data else "itls"},
    )
    return _with_conventions(run, data, sums, itls)


def _ms(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    return float(value) if isinstance(value, int | float) else None


def _with_conventions(
    run: ImportedRun, data: Mapping[str, Any], sums: Floats, itls: list[Floats]
) -> ImportedRun:
    """Check on the file how vLLM defined each metric (its saved summaries against the same
    recomputed from the per-request fields) and record the result in ``run.conventions``."""
    ok = run.ok
    tpots = per_request_tpot_s(run)[ok]
    tpots = tpots[np.isfinite(tpots)]
    pooled = np.concatenate([itls[i] for i in np.flatnonzero(ok)]) if ok.any() else np.array([])
    mismatched = int(np.sum(np.abs(sums[ok] - run.e2e_s[ok]) > 1e-6))
    conventions = {
        "ttft": convention(
            "first streamed chunk − send; the server's queueing included, the client's "
            "--max-concurrency wait (queue_times) not",
            _ms(data, "median_ttft_ms"),
            float(np.median(run.ttft_s[ok]) * 1e3) if ok.any() else float("nan"),
            "median_ttft_ms",
        ),
        "tpot": convention(
            "(latency − TTFT) / (output tokens − 1), requests with 2+ tokens; first token excluded",
            _ms(data, "mean_tpot_ms"),
            float(np.mean(tpots) * 1e3) if tpots.size else 0.0,
            "mean_tpot_ms",
        ),
        "itl": convention(
            "gaps between consecutive streamed chunks, pooled over requests",
            _ms(data, "mean_itl_ms"),
            float(np.mean(pooled) * 1e3) if pooled.size else 0.0,
            "mean_itl_ms",
        ),
        "e2e": {
            "definition": "last streamed chunk − send (latencies = TTFT + Σ ITL)",
            "checked": True,
            "agrees": mismatched == 0,
            "note": f"TTFT + Σ ITL = latency on {int(ok.sum()) - mismatched} of {int(ok.sum())} "
            "requests",
        },
        "sampling": {
            "definition": "what the requests asked the engine to sample (not in the file)",
            "checked": False,
            "agrees": None,  # unknown: the file does not say
            "note": "vllm bench serve 0.32 sends no temperature unless --temperature is given, "
            "and the server then samples at its default over the whole vocabulary: more work a "
            "step than the greedy requests the simulator's profile and our client make; "
            "benchmark with --temperature=0 to compare with them",
        },
    }
    return ImportedRun(**{**run.__dict__, "conventions": conventions})
