"""The ``bench_import`` stage: bring your own truth, and give ours back.

Import (``source=``): every run in a ``vllm bench serve`` result or a GuideLLM
``benchmarks.json`` becomes ``tmp/workload/<id>`` (the lengths and arrivals it implies) and
``tmp/real_bench/<id>`` (what it measured), which ``vidur_simulate`` and ``compare`` take like
any run of ours (``capacity`` takes the workload's lengths as a shape; the fidelity stage's sim
phase takes the whole import, ``fidelity.real_from=tmp/bench_import/<id>``, each run a load);
``tmp/bench_import/<id>`` keeps the manifest. Everything that can be wrong with the file fails
before any directory is created. Export (``export_from=``): a real_bench or vidur_simulate run
as a ``vllm bench serve`` result JSON in ``tmp/bench_import/<id>``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from gpu_simulate_test.bench_import.contract import (
    IMPORT_MANIFEST,
    IMPORT_MANIFEST_VERSION,
    REAL_SUMMARY_JSON,
    VLLM_RESULT_JSON,
)
from gpu_simulate_test.bench_import.export import vllm_result
from gpu_simulate_test.bench_import.guidellm import is_guidellm_report, read_guidellm
from gpu_simulate_test.bench_import.imported import (
    ImportedRun,
    check_run,
    disagreements,
)
from gpu_simulate_test.bench_import.vllm_bench import is_vllm_result, load_results, read_vllm_bench
from gpu_simulate_test.bench_import.write import write_imported_truth, write_imported_workload
from gpu_simulate_test.config.bench_import import BenchImportStageConfig
from gpu_simulate_test.core.reporting import console, print_table
from gpu_simulate_test.core.traffic.workloads import told_rate
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, atomic_open, read_csv, read_json
from gpu_simulate_test.io.runs import RunExistsError, default_run_id, open_upstream_run, start_run
from gpu_simulate_test.io.schemas import REQUEST_METRICS, TOKEN_METRICS

EXPORTABLE_STAGES: tuple[str, ...] = ("real_bench", "vidur_simulate")


def read_source(cfg: BenchImportStageConfig) -> list[ImportedRun]:
    """Parse ``cfg.source`` into runs (the ones ``cfg.benchmarks`` picks) and check each."""
    assert cfg.source is not None
    path = Path(cfg.source)
    if not path.is_file():
        said = "a directory" if path.is_dir() else "no such file"
        raise ArtifactError(f"source={path}: {said}; expected a result file to import")
    results = load_results(path)
    fmt = cfg.format
    if fmt == "auto":
        if len(results) == 1 and is_guidellm_report(results[0]):
            fmt = "guidellm"
        elif all(is_vllm_result(r) for r in results):
            fmt = "vllm_bench"
        else:
            raise ArtifactError(
                f"{path}: neither a `vllm bench serve` result (no 'endpoint_type', "
                "'mean_ttft_ms' or 'ttfts') nor a GuideLLM report (no 'benchmarks' list); pass "
                "a file either tool saved, or format=vllm_bench|guidellm"
            )
    runs = read_guidellm(path, results[0]) if fmt == "guidellm" else read_vllm_bench(path, results)
    if cfg.benchmarks:
        beyond = [b for b in cfg.benchmarks if b >= len(runs)]
        if beyond:
            raise ArtifactError(
                f"benchmarks={list(cfg.benchmarks)}: {path} holds {len(runs)} run(s) "
                f"(0..{len(runs) - 1}); pick among those"
            )
        runs = [runs[b] for b in cfg.benchmarks]
    for run in runs:
        check_run(run, cfg.model)
    return runs


def _run_ids(cfg: BenchImportStageConfig, run_id: str, count: int) -> list[str]:
    """``<run_id>`` for one run, ``<run_id>-<k>`` for several; refused up front if any
    workload or real_bench run of that id exists (never overwritten unless asked)."""
    ids = [run_id] if count == 1 else [f"{run_id}-{k}" for k in range(count)]
    for rid in ids:
        for stage in ("workload", "real_bench"):
            path = layout.run_dir(cfg.output.root, stage, rid)
            if not path.exists():
                continue
            if not cfg.output.overwrite:
                raise RunExistsError(
                    f"{path} already exists; choose another output.run_id or pass "
                    "output.overwrite=true"
                )
            if _written_as(path) != run_id:  # another run's: overwrite replaces only its own
                raise RunExistsError(
                    f"{path} already exists and is not a run of bench_import output.run_id="
                    f"{run_id} (output.overwrite=true replaces only that id's runs); choose "
                    "another output.run_id"
                )
    return ids


def _written_as(path: Path) -> str | None:
    """The ``output.run_id`` of the bench_import that wrote the run at ``path`` (None: another
    stage's run, or unreadable)."""
    try:
        meta = read_json(path / layout.RUN_META)
    except ArtifactError:
        return None
    config = meta.get("config")
    if not isinstance(config, Mapping) or "source" not in config or "export_from" not in config:
        return None  # not written by an import (its config has both)
    output = config.get("output") or {}
    return output.get("run_id") if isinstance(output, Mapping) else None


def run(cfg: BenchImportStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """Import ``cfg.source`` or export ``cfg.export_from``; returns the bench_import run."""
    if cfg.export_from:
        return run_export(cfg, resolved_config)
    runs = read_source(cfg)
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    ids = _run_ids(cfg, run_id, len(runs))
    source = Path(str(cfg.source))
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    root, overwrite = cfg.output.root, cfg.output.overwrite
    entries: list[dict[str, Any]] = []
    summaries: list[dict[str, Any]] = []
    with start_run(root, "bench_import", run_id, resolved_config, overwrite) as r:
        for imported, rid in zip(runs, ids, strict=True):
            # the workload is complete only with its truth: a truth that fails marks both failed
            with start_run(root, "workload", rid, resolved_config, overwrite) as w:
                meta = write_imported_workload(w, imported, cfg.model, cfg.seed)
                with start_run(root, "real_bench", rid, resolved_config, overwrite) as t:
                    summary = write_imported_truth(t, imported, str(w.path), meta["workload_id"])
            summaries.append(summary)
            entries.append(
                {
                    "label": imported.label,
                    "workload_dir": str(w.path),
                    "real_dir": str(t.path),
                    "workload_id": meta["workload_id"],
                    "num_requests": int(imported.ok.sum()),
                    "left_out_failed_requests": int((~imported.ok).sum()),
                    "conventions": imported.conventions,
                    "disagreements": disagreements(imported.conventions),
                    "settings": imported.settings,
                }
            )
        manifest = {
            "schema_version": IMPORT_MANIFEST_VERSION,
            "direction": "import",
            "tool": runs[0].tool,
            "source": {"path": str(source), "sha256": digest},
            "runs": entries,
        }
        with atomic_open(r.file(IMPORT_MANIFEST)) as handle:
            json.dump(manifest, handle, indent=2, default=str)
        r.update_meta(direction="import", tool=runs[0].tool, source=str(source), runs=len(runs))
    if cfg.progress:
        _print_import(entries, summaries, r.path)
    return r.path


def _print_import(
    entries: list[dict[str, Any]], summaries: list[dict[str, Any]], path: Path
) -> None:
    rows = []
    for entry, summary in zip(entries, summaries, strict=True):
        rows.append(
            [
                entry["label"] or "-",
                str(entry["num_requests"]),
                f"{summary['median_ttft_ms']:.1f} / {summary['p99_ttft_ms']:.1f}",
                f"{summary['median_tpot_ms']:.2f} / {summary['p99_tpot_ms']:.2f}",
                entry["real_dir"],
            ]
        )
    print_table(
        "imported runs",
        ["run", "requests", "TTFT p50 / p99 (ms)", "TPOT p50 / p99 (ms)", "real_bench run"],
        rows,
    )
    first = entries[0]["conventions"]
    for name, conv in first.items():
        mark = "confirmed" if conv.get("agrees") else ("not checked" if not conv.get("checked")
                                                     else "[bold yellow]differs[/]")  # fmt: skip
        console.print(f"- {name}: {conv['definition']} ({mark}: {conv['note']})")
    for entry in entries:
        for line in entry["disagreements"]:
            console.print(f"[bold yellow]{entry['label'] or 'run'}:[/] {line}")
    console.print(f"[bold]manifest:[/] {path / IMPORT_MANIFEST}")


def export_run(
    path: Path, metrics: tuple[str, ...], percentiles: tuple[int, ...]
) -> dict[str, Any]:
    """A complete real_bench or vidur_simulate run as a ``vllm bench serve`` result."""
    meta = read_json(path / layout.RUN_META, required_keys=("stage",)) if path.is_dir() else {}
    stage = meta.get("stage")
    if stage not in EXPORTABLE_STAGES:
        raise ArtifactError(
            f"export_from={path}: {'a ' + str(stage) + ' run' if stage else 'not a run directory'}"
            f"; expected a {' or '.join(EXPORTABLE_STAGES)} run"
        )
    meta = open_upstream_run(path, str(stage))
    requests = read_csv(path / layout.REQUEST_METRICS, REQUEST_METRICS)
    token_path = path / layout.TOKEN_METRICS
    tokens = read_csv(token_path, TOKEN_METRICS) if token_path.is_file() else None
    model = (meta.get("config") or {}).get("model") or {}
    model_id = model.get("hf_name") or model.get("name")
    workload: dict[str, Any] = {}
    workload_dir = meta.get("workload_dir") or (meta.get("config") or {}).get("workload_dir")
    if workload_dir and (Path(workload_dir) / layout.WORKLOAD_META).is_file():
        workload = read_json(Path(workload_dir) / layout.WORKLOAD_META)
    rate = told_rate(workload)
    burstiness = ((workload.get("generator") or {}).get("arrival") or {}).get("burstiness")
    backend = (meta.get("backend") or {}).get("name") if stage == "real_bench" else "vidur"
    header = {
        "date": run_date(path, meta),
        "backend": backend or stage,
        "label": f"gpu-simulate-test {stage} {meta.get('run_id')}",
        "model_id": model_id,
        "tokenizer_id": model_id,
        "request_rate": rate,
        "burstiness": 1.0 if burstiness is None else burstiness,
        "max_concurrency": None,
    }
    if stage == "real_bench" and (meta.get("backend") or {}).get("imported"):
        header.update(imported_header(path))
    return vllm_result(requests, tokens, header=header, metrics=metrics, percentiles=percentiles)


IMPORTED_HEADER_KEYS: tuple[str, ...] = (
    "backend",
    "model_id",
    "tokenizer_id",
    "request_rate",
    "burstiness",
    "max_concurrency",
)
"""What an imported run's export takes from the file it came from (its ``summary.json`` keeps
them): the tool's backend, model, told rate and concurrency, not the import's stand-ins (the
tool's name, the model config, the rate the imported arrivals realized)."""


def imported_header(path: Path) -> dict[str, Any]:
    """The header an imported real_bench run's source file gave (where it gave one)."""
    summary = read_json(path / REAL_SUMMARY_JSON)
    return {k: summary[k] for k in IMPORTED_HEADER_KEYS if summary.get(k) is not None}


def run_date(path: Path, meta: Mapping[str, Any]) -> str | None:
    """When the run at ``path`` ran, as ``vllm bench serve`` dates a result (``%Y%m%d-%H%M%S``):
    its ``summary.json`` ``date`` (an imported run's is its benchmark's), else the start of the
    run (UTC); None where neither says (the export's clock then)."""
    summary = path / REAL_SUMMARY_JSON
    if summary.is_file():
        date = read_json(summary).get("date")
        if isinstance(date, str) and date:
            return date
    started = meta.get("start_time")
    if not isinstance(started, str):
        return None
    try:
        return datetime.fromisoformat(started).astimezone(UTC).strftime("%Y%m%d-%H%M%S")
    except ValueError:
        return None


def run_export(cfg: BenchImportStageConfig, resolved_config: Mapping[str, Any]) -> Path:
    """Write ``cfg.export_from`` as ``vllm_bench_serve.json`` in a bench_import run."""
    source = Path(str(cfg.export_from))
    try:
        result = export_run(source, cfg.export_metrics, cfg.export_percentiles)
    except ArtifactError:
        raise  # names its own file and field
    except ValueError as exc:  # an unknown percentile: not in the one list
        raise ArtifactError(f"export_percentiles={list(cfg.export_percentiles)}: {exc}") from exc
    run_id = cfg.output.run_id or default_run_id(resolved_config)
    root, overwrite = cfg.output.root, cfg.output.overwrite
    with start_run(root, "bench_import", run_id, resolved_config, overwrite) as r:
        with atomic_open(r.file(VLLM_RESULT_JSON)) as handle:
            json.dump(result, handle)  # as vLLM: insertion order, no indent
        r.update_meta(
            direction="export", export_from=str(source), num_requests=len(result["ttfts"])
        )
    if cfg.progress:
        ttft = np.asarray(result["ttfts"])
        console.print(
            f"exported {len(ttft)} requests ({result['completed']} completed), "
            f"median TTFT {result['median_ttft_ms']:.1f} ms"
            if "median_ttft_ms" in result
            else f"exported {len(ttft)} requests ({result['completed']} completed)"
        )
        console.print(f"[bold]vllm bench serve result:[/] {r.file(VLLM_RESULT_JSON)}")
    return r.path
