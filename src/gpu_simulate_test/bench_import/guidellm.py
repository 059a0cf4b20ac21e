"""Read a GuideLLM ``benchmarks.json`` (report schema version 2, guidellm 0.8): every benchmark
of a sweep is one run.

What each successful request holds (``guidellm/schemas/base/request_stats.py`` and
``info.py`` of guidellm 0.8.1, read, not assumed; the summaries are checked on the file):

- ``info.timings``: ``targeted_start`` (when the profile meant to send it), ``request_start``
  (when the HTTP request went out), ``first_token_iteration`` and ``last_token_iteration``
  (first and last streamed token), ``request_end`` (the stream closed); every one a wall-clock
  ``time.time()``;
- ``time_to_first_token_ms`` = first token − ``request_start``: the server's queueing in, the
  client's lateness (``request_dispatch_delay``) out, as ``vllm bench serve``;
- ``inter_token_latency_ms`` = (last − first token) / (output tokens − 1): what ``vllm bench
  serve`` calls TPOT; its run summary weights it by tokens (Σ(n − 1) samples);
- ``time_per_output_token_ms`` = (last token − ``request_start``) / output tokens: TTFT
  **included**, not vLLM's TPOT; the import keeps vLLM's;
- ``request_latency`` = ``request_end`` − ``request_start``, a little after the last token; our
  E2E ends at the last token;
- no time per token or per chunk: an import has no ``token_metrics.csv`` and no pooled ITL.

Errored and incomplete requests are left out (counted).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from gpu_simulate_test.bench_import.imported import (
    Floats,
    ImportedRun,
    convention,
)
from gpu_simulate_test.io.artifacts import ArtifactError, is_finite_number

TOOL = "guidellm"
REPORT_VERSION = 2
"""The report schema (``metadata.version``) this reader knows: guidellm 0.8."""


_TIMINGS = "requests.successful[{i}].info.timings"
FIELDS: Mapping[str, str] = MappingProxyType(
    {
        "errors": "requests.successful",
        "start_times": f"{_TIMINGS}.request_start",
        "queue_times": f"{_TIMINGS}.targeted_start",
        "ttft": f"{_TIMINGS}.first_token_iteration",
        "latency": f"{_TIMINGS}.last_token_iteration",
        "input_lens": "requests.successful[{i}].prompt_tokens",
        "output_lens": "requests.successful[{i}].output_tokens",
    }
)
"""Where the import's checks find each quantity in a GuideLLM report (a run's successful
requests come first, so request ``i`` is ``requests.successful[i]``)."""


def is_guidellm_report(data: Any) -> bool:
    """Whether a parsed JSON value looks like a GuideLLM report."""
    return isinstance(data, Mapping) and isinstance(data.get("benchmarks"), list)


def read_guidellm(path: Path, report: Mapping[str, Any]) -> list[ImportedRun]:
    """Every benchmark of the report as a run (``benchmark <k> (<strategy>@<rate>)``)."""
    metadata = report.get("metadata")
    version = metadata.get("version") if isinstance(metadata, Mapping) else None
    if version != REPORT_VERSION:
        made_by = metadata.get("guidellm_version") if isinstance(metadata, Mapping) else None
        raise ArtifactError(
            f"{path}: field 'metadata.version' is {version!r} (guidellm {made_by or 'unknown'}); "
            f"this importer reads GuideLLM report version {REPORT_VERSION} (guidellm 0.8): "
            "re-run the benchmark with guidellm 0.8, or import its results as a `vllm bench "
            "serve` result"
        )
    version_of_tool = metadata.get("guidellm_version") if isinstance(metadata, Mapping) else None
    runs = []
    for k, bench in enumerate(report["benchmarks"]):
        if not isinstance(bench, Mapping):
            raise ArtifactError(
                f"{path}: field 'benchmarks[{k}]' is {type(bench).__name__}, expected an object "
                "(one benchmark of guidellm 0.8's benchmarks.json)"
            )
        runs.append(parse_benchmark(path, k, bench, version_of_tool))
    if not runs:
        raise ArtifactError(f"{path}: field 'benchmarks' is empty; nothing to import")
    return runs


def _object(value: Any) -> Mapping[str, Any]:
    """``value`` where it is a JSON object, else an empty one (a field that is not read)."""
    return value if isinstance(value, Mapping) else {}


def _strategy(bench: Mapping[str, Any]) -> Mapping[str, Any]:
    return _object(_object(bench.get("config")).get("strategy"))


def _label(k: int, bench: Mapping[str, Any]) -> str:
    strategy = _strategy(bench)
    kind = strategy.get("type_", "?")
    rate = strategy.get("rate")
    said = "" if rate is None else f"@{rate:g}" if isinstance(rate, int | float) else f"@{rate}"
    return f"benchmark {k} ({kind}{said})"


def _utc_date(start_time: Any) -> str | None:
    """A benchmark's ``start_time`` (``time.time()``) as ``vllm bench serve`` dates its runs."""
    if not is_finite_number(start_time):
        return None
    return datetime.fromtimestamp(start_time, UTC).strftime("%Y%m%d-%H%M%S")


def _timing(path: Path, label: str, i: int, timings: Mapping[str, Any], key: str) -> float:
    value = timings.get(key)
    if is_finite_number(value):
        return float(value)
    raise ArtifactError(
        f"{path} ({label}), field 'requests.successful[{i}].info.timings.{key}': "
        f"{value!r}, expected a time in seconds (a streamed request of guidellm 0.8)"
    )


def parse_benchmark(
    path: Path, k: int, bench: Mapping[str, Any], tool_version: str | None
) -> ImportedRun:
    """One benchmark of a GuideLLM report as an :class:`ImportedRun`."""
    label = _label(k, bench)
    requests = bench.get("requests")
    if not isinstance(requests, Mapping) or not isinstance(requests.get("successful"), list):
        raise ArtifactError(
            f"{path} ({label}), field 'requests.successful': missing; expected the per-request "
            "statistics guidellm 0.8 saves in benchmarks.json"
        )
    good = requests["successful"]
    failed = sum(
        len(kept) if isinstance(kept := requests.get(kind), list) else 0
        for kind in ("errored", "incomplete")
    )
    start, target, first, last, end = [], [], [], [], []
    prompt, output = [], []
    for i, req in enumerate(good):
        if not isinstance(req, Mapping):
            raise ArtifactError(
                f"{path} ({label}), field 'requests.successful[{i}]': {req!r}, expected an "
                "object (one request's statistics, as guidellm 0.8 saves them)"
            )
        timings = _object(_object(req.get("info")).get("timings"))
        start.append(_timing(path, label, i, timings, "request_start"))
        first.append(_timing(path, label, i, timings, "first_token_iteration"))
        last.append(_timing(path, label, i, timings, "last_token_iteration"))
        end.append(_timing(path, label, i, timings, "request_end"))
        targeted = timings.get("targeted_start")
        target.append(_timing(path, label, i, timings, "targeted_start") if targeted is not None
                      else start[-1])  # fmt: skip
        prompt.append(req.get("prompt_tokens"))
        output.append(req.get("output_tokens"))
    for name, values in (("prompt_tokens", prompt), ("output_tokens", output)):
        bad = [i for i, v in enumerate(values) if not isinstance(v, int) or isinstance(v, bool)]
        if bad:
            raise ArtifactError(
                f"{path} ({label}), field 'requests.successful[{bad[0]}].{name}': "
                f"{values[bad[0]]!r}, expected a token count (the server's usage)"
            )
    n = len(good) + failed
    send = np.array(start + [np.nan] * failed)
    strategy = _strategy(bench)
    run = ImportedRun(
        tool=TOOL,
        source=path,
        label=label,
        ok=np.array([True] * len(good) + [False] * failed, dtype=bool),
        send_time_s=send,
        scheduled_time_s=np.array(target + [np.nan] * failed),
        num_prefill_tokens=np.array(prompt + [0] * failed, dtype=np.int64),
        num_decode_tokens=np.array(output + [0] * failed, dtype=np.int64),
        ttft_s=np.array(first + [np.nan] * failed) - send,
        e2e_s=np.array(last + [np.nan] * failed) - send,
        event_offsets_s=tuple(np.array([]) for _ in range(n)),
        errors=tuple([""] * len(good) + ["errored or incomplete"] * failed),
        settings={
            "date": _utc_date(bench.get("start_time")),
            "start_time": bench.get("start_time"),
            "guidellm_version": tool_version,
            "strategy": strategy.get("type_"),
            "request_rate": strategy.get("rate"),
            "max_concurrency": None,
            "duration": bench.get("duration"),
        },
        fields=dict(FIELDS),
    )
    metrics = _object(bench.get("metrics"))
    request_end = np.array(end) - np.array(start)
    return ImportedRun(**{**run.__dict__, "conventions": _conventions(run, metrics, request_end)})


def _mean(metrics: Mapping[str, Any], name: str) -> float | None:
    value = _object(_object(metrics.get(name)).get("successful")).get("mean")
    return float(value) if isinstance(value, int | float) else None


def _conventions(
    run: ImportedRun, metrics: Mapping[str, Any], request_latency_s: Floats
) -> dict[str, Any]:
    """GuideLLM's definitions, each checked against its own run summary (token-weighted where
    GuideLLM weights by tokens), and how they map onto ours."""
    ok = run.ok
    if not ok.any():  # nothing to check against (the import refuses such a run: check_run)
        return {}
    ttft, e2e, n = run.ttft_s[ok], run.e2e_s[ok], run.num_decode_tokens[ok].astype(float)
    many = n > 1
    vllm_tpot = (e2e[many] - ttft[many]) / (n[many] - 1)
    guidellm_tpot = e2e / n
    tail_ms = (request_latency_s - e2e) * 1e3
    return {
        "ttft": convention(
            "first streamed token − request_start (the send); the server's queueing included, "
            "the client's dispatch delay not (as vllm bench serve)",
            _mean(metrics, "time_to_first_token_ms"),
            float(np.mean(ttft) * 1e3),
            "mean time_to_first_token_ms",
        ),
        "tpot": convention(
            "GuideLLM's inter_token_latency_ms = (last − first token) / (output − 1) is vllm "
            "bench serve's TPOT and is what the import keeps (GuideLLM token-weights its mean)",
            _mean(metrics, "inter_token_latency_ms"),
            float(np.average(vllm_tpot, weights=n[many] - 1) * 1e3) if many.any() else 0.0,
            "token-weighted mean inter_token_latency_ms",
        ),
        "guidellm_tpot": convention(
            "GuideLLM's time_per_output_token_ms = (last token − request_start) / output: the "
            "first token and TTFT included, NOT vllm's TPOT (left out of the import)",
            _mean(metrics, "time_per_output_token_ms"),
            float(np.average(guidellm_tpot, weights=n) * 1e3),
            "token-weighted mean time_per_output_token_ms",
        ),
        "e2e": {
            "definition": "last streamed token − request_start; GuideLLM's request_latency ends "
            "at request_end, after the stream closes",
            "checked": True,
            "agrees": True,
            "note": f"request_latency − E2E: median {float(np.median(tail_ms)):.3f} ms, "
            f"max {float(np.max(tail_ms)):.3f} ms",
        },
        "itl": {
            "definition": "not kept: GuideLLM saves only the first and last token times",
            "checked": False,
            "note": "no token_metrics.csv, no pooled ITL",
        },
    }
