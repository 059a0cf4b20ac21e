"""The fidelity sim phase on a bench_import run: another tool's benchmark (a ``vllm bench serve``
result, several appended ones, a GuideLLM sweep) taken as the loads of a real phase.

An import records no campaign: no capacity probe, no engine config, no scheduler. This module
builds, from ``import.json`` and the imported runs, the plan the sim phase iterates over (the
shape of a real phase's manifest, :mod:`.manifest`), with the config given on the command line
(model, hardware, backend knobs, profile bundle) in place of a recorded one:

- **a load per offered rate**: each imported run at the rate its arrivals realized (requests − 1
  over the span of its sends); runs at the same rate the tool was told (``request_rate``,
  GuideLLM's strategy rate) are one load, the first simulated, the others its real repeats (the
  real-vs-real noise floor, as ``fidelity.real_repeats``);
- **the capacity**: ``fidelity.capacity_qps`` when given; else a burst among the runs (GuideLLM's
  ``throughput`` benchmark, ``vllm bench serve`` at an infinite rate without a concurrency cap)
  by the capacity probe's rule; else the highest offered rate, which is no measured capacity
  (the report says which);
- **no scheduler check** (nothing recorded to check against) and **no disturbance verdict** (the
  tools record no such signs): the report says so, and that the noise floor is unknown for loads
  with one run.

Every input check runs before the fidelity run directory exists.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.bench_import.contract import IMPORT_MANIFEST, IMPORT_MANIFEST_VERSION
from gpu_simulate_test.compare.metrics import offered_qps
from gpu_simulate_test.config.fidelity import FidelityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.core.metrics import window
from gpu_simulate_test.core.metrics.capacity_probe import probe_record
from gpu_simulate_test.core.run_inputs import load_run
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, read_json
from gpu_simulate_test.io.runs import open_upstream_run
from gpu_simulate_test.orchestrate.profiling import profile_plan

IMPORT_STAGE = "bench_import"


@dataclasses.dataclass(frozen=True)
class ImportedRunDirs:
    """One run of the import, read back: where it is and what its arrivals offered."""

    index: int
    label: str
    workload_dir: Path
    real_dir: Path
    requests: pd.DataFrame
    offered_qps: float
    """Requests − 1 over the span of its sends, as ``compare`` counts it (inf when all were sent
    at once, NaN with fewer than two)."""
    nominal_qps: float | None
    """The rate the tool was told (None: none, or infinite)."""
    burst: bool
    """Sent all at once: GuideLLM's throughput benchmark, vllm bench serve at an infinite rate
    without a concurrency cap."""


def is_import(src: Path) -> bool:
    """Whether ``src`` is a bench_import run directory (its ``run_meta.json`` says so, or it
    holds ``import.json``)."""
    if (src / IMPORT_MANIFEST).is_file():
        return True
    try:
        meta = json.loads((src / layout.RUN_META).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and meta.get("stage") == IMPORT_STAGE


def read_import(src: Path) -> dict[str, Any]:
    """``import.json`` of a complete bench_import run, checked: readable, of this version, an
    import (not an export), every run with its two directories."""
    open_upstream_run(src, IMPORT_STAGE)
    path = src / IMPORT_MANIFEST
    if not path.is_file():
        raise ArtifactError(
            f"{path}: missing; a bench_import run keeps which runs it imported there (an export "
            "writes none): import the file again (python -m gpu_simulate_test.cli.bench_import "
            "source=<file>)"
        )
    data = read_json(path)
    version = data.get("schema_version")
    if version != IMPORT_MANIFEST_VERSION:
        raise ArtifactError(
            f"{path}: field 'schema_version' is {version!r}, expected "
            f"{IMPORT_MANIFEST_VERSION!r}: import the file again with this version"
        )
    if data.get("direction") != "import":
        raise ArtifactError(
            f"{path}: field 'direction' is {data.get('direction')!r}, expected 'import' (an "
            "export holds no run to simulate)"
        )
    runs = data.get("runs")
    if not isinstance(runs, list) or not runs:
        raise ArtifactError(f"{path}: field 'runs' is {runs!r}, expected the imported runs")
    for k, entry in enumerate(runs):
        for key in ("workload_dir", "real_dir"):
            value = entry.get(key) if isinstance(entry, dict) else None
            if not isinstance(value, str) or not value:
                raise ArtifactError(
                    f"{path}: field 'runs[{k}].{key}' is {value!r}, expected the directory of "
                    "the run it imported"
                )
    return data


def _run_dir(recorded: str, src: Path, stage: str) -> Path:
    """A run directory ``import.json`` names: as recorded (absolute, or relative to where the
    import ran), else under the import's own output root (``tmp/`` moved as a whole)."""
    path = Path(recorded)
    if path.is_dir():
        return path.resolve()
    beside = src.parent.parent / stage / path.name
    return beside.resolve() if beside.is_dir() else path


def _rate(value: Any) -> float | None:
    """A finite positive rate the tool was told, else None (``inf``, absent)."""
    if isinstance(value, int | float) and math.isfinite(value) and value > 0:
        return float(value)
    return None


def read_runs(src: Path, data: dict[str, Any], model: str) -> list[ImportedRunDirs]:
    """Every run of the import, its directories checked complete and made for ``model``."""
    where = src / IMPORT_MANIFEST
    runs = []
    for k, entry in enumerate(data["runs"]):
        dirs = {}
        for key, stage in (("workload_dir", "workload"), ("real_dir", "real_bench")):
            dirs[key] = _run_dir(entry[key], src, stage)
            try:
                open_upstream_run(dirs[key], stage)
            except ArtifactError as exc:
                raise ArtifactError(f"{where}, field 'runs[{k}].{key}': {exc}") from exc
        meta_path = dirs["workload_dir"] / layout.WORKLOAD_META
        made_for = read_json(meta_path, required_keys=("model",))["model"]
        if made_for != model:
            raise ArtifactError(
                f"{meta_path}: field 'model' is {made_for!r}, but this command simulates "
                f"model={model}: pass model={made_for} (the model the import was made for)"
            )
        requests = load_run(dirs["real_dir"], "real_bench").requests
        offered = offered_qps(requests["arrival_time_s"].to_numpy(dtype=float))
        settings = entry.get("settings") or {}
        told = settings.get("request_rate")
        unbounded = isinstance(told, str | float) and str(told).lower() in ("inf", "infinity")
        burst = settings.get("strategy") == "throughput" or (
            unbounded and settings.get("max_concurrency") is None
        )
        runs.append(
            ImportedRunDirs(
                index=k,
                label=str(entry.get("label") or f"run {k}"),
                workload_dir=dirs["workload_dir"],
                real_dir=dirs["real_dir"],
                requests=requests,
                offered_qps=float(f"{offered:.4g}") if math.isfinite(offered) else offered,
                nominal_qps=_rate(told),
                burst=burst or not math.isfinite(offered),
            )
        )
    return runs


def group_loads(runs: list[ImportedRunDirs]) -> list[list[ImportedRunDirs]]:
    """The loads, by offered rate: runs the tool was told the same rate make one load (the first
    simulated, the rest its real repeats); bursts are no load."""
    groups: dict[tuple[str, float], list[ImportedRunDirs]] = {}
    for run in runs:
        if run.burst:
            continue
        key = ("told", run.nominal_qps) if run.nominal_qps else ("run", float(run.index))
        groups.setdefault(key, []).append(run)
    return sorted(groups.values(), key=lambda g: (g[0].offered_qps, g[0].index))


def capacity_of(
    given_qps: float, runs: list[ImportedRunDirs], loads: list[list[ImportedRunDirs]]
) -> dict[str, Any]:
    """The capacity the loads are fractions of (``given_qps``: ``fidelity.capacity_qps``, 0 for
    none), with ``source`` saying how it was derived."""
    bursts = [run for run in runs if run.burst]
    record: dict[str, Any] = {
        "probe_requests": 0,
        "probe_ok": 0,
        "probe_run": None,
        "output_tokens_per_s": None,
    }
    if given_qps:
        return {
            **record,
            "capacity_qps": given_qps,
            "derived_from": "fidelity.capacity_qps",
            "source": f"fidelity.capacity_qps={given_qps:g}, given on the command line",
        }
    if bursts:
        probe = bursts[0]
        req = probe.requests
        return {
            **probe_record(req, str(probe.real_dir)),
            "derived_from": "burst run",
            "source": f"the imported burst {probe.label} ({len(req)} requests sent at once): "
            "completed requests / (last completion − first send), the capacity probe's rule",
        }
    top = max((group[0] for group in loads), key=lambda run: run.offered_qps)
    return {
        **record,
        "capacity_qps": top.offered_qps,
        "derived_from": "highest offered rate",
        "source": f"the highest offered rate among the imported runs ({top.label}, "
        f"{top.offered_qps:.4g} req/s), not a measured capacity: the import has no burst to "
        "measure one (pass fidelity.capacity_qps=<req/s> for a known one)",
    }


def check_window(run: ImportedRunDirs, warmup_s: float) -> None:
    """Refuse a run whose every request falls in the warm-up: nothing would be measured."""
    measured = int(window.in_window(run.requests, warmup_s).sum())
    if measured == 0:
        arrivals = window.reference_arrivals_s(run.requests)
        span = float(np.nanmax(arrivals) - np.nanmin(arrivals))
        raise ArtifactError(
            f"{run.real_dir}: every one of its {len(run.requests)} requests arrives within "
            f"fidelity.warmup_s={warmup_s:g} s of the first (its arrivals span {span:.3g} s): "
            f"nothing would be measured; pass fidelity.warmup_s=0 (or under {span:.3g})"
        )


def noise_floor(loads: list[list[ImportedRunDirs]], fractions: list[float]) -> str:
    """What the report says of the real-vs-real noise floor of these loads."""
    single = [f"{f:.0%}" for f, group in zip(fractions, loads, strict=True) if len(group) == 1]
    if not single:
        return "from the imported runs at the same rate (real vs real), for every load"
    text = (
        f"unknown for the loads at {', '.join(single)} of capacity: the import holds one run at "
        "their rate (real vs real needs two runs the tool was told the same rate)"
    )
    return text if len(single) == len(loads) else text + "; the others: real vs real"


def load_sizes(loads: list[list[ImportedRunDirs]]) -> dict[str, Any]:
    """``requests_per_load`` and ``load_duration_s`` (arrival span, s) of the loads' first runs:
    one value where every load has it, else the range ``"smallest–largest"``."""

    def said(values: list[Any]) -> Any:
        low, high = min(values), max(values)
        return low if low == high else f"{low}–{high}"

    spans = [float(np.ptp(g[0].requests["arrival_time_s"].to_numpy(dtype=float))) for g in loads]
    return {
        "requests_per_load": said([len(g[0].requests) for g in loads]),
        "load_duration_s": said([round(span, 2) for span in spans]),
    }


def import_source(cfg: FidelityStageConfig, src: Path) -> dict[str, Any]:
    """The sim phase's source for a bench_import run: the plan in a real phase manifest's shape,
    this command's config, and what the report says of the import (``imported``)."""
    data = read_import(src)
    runs = read_runs(src, data, cfg.model.name)
    loads = group_loads(runs)
    if not loads:
        raise ArtifactError(
            f"{src / IMPORT_MANIFEST}: field 'runs' holds bursts only (requests sent at once: a "
            "capacity, no load to simulate); import a run at an offered rate"
        )
    warmup_s = cfg.fidelity.warmup_s
    for group in loads:
        for run in group:
            check_window(run, warmup_s)
    capacity = capacity_of(cfg.fidelity.capacity_qps, runs, loads)
    fractions = [float(f"{g[0].offered_qps / capacity['capacity_qps']:.4g}") for g in loads]
    root = Path(cfg.profiling_root).resolve()
    config = dataclasses.replace(cfg.pipeline(), profiling_root=str(root), reuse_profile=True)
    planned = plan_loads(config, loads, fractions, cfg.backend.name, warmup_s)
    imported, notes = describe_import(src, data, runs, loads, fractions, capacity, cfg.backend.name)
    tool = imported["tool"]
    source = data.get("source") or {}
    settings = [entry.get("settings") or {} for entry in data["runs"]]
    version = next((s.get("guidellm_version") for s in settings if s.get("guidellm_version")), None)
    manifest = {
        "name": src.name,
        "command": f"python -m gpu_simulate_test.cli.bench_import source={source.get('path')}",
        "date": next((s["date"] for s in settings if s.get("date")), "not in the file"),
        "device": f"not recorded ({tool})",
        "versions": {tool: version or "not in the file"},
        **load_sizes(loads),
        "warmup_s": warmup_s,
        "load_fractions": fractions,
        "wall_time_s": 0.0,
        "complete": True,
        "backends": {
            cfg.backend.name: {
                "config": None,
                "profiling_root": str(root),
                "capacity": capacity,
                "loads": planned,
            }
        },
    }
    return {
        "root": src,
        "manifest": manifest,
        "notes": notes,
        "config": config,
        "imported": imported,
    }


def plan_loads(
    config: PipelineStageConfig,
    loads: list[list[ImportedRunDirs]],
    fractions: list[float],
    backend: str,
    warmup_s: float,
) -> list[dict[str, Any]]:
    """The loads in a real phase manifest's shape, each checked to be covered by the bundle
    (the sim phase never profiles)."""
    planned = []
    for index, (fraction, group) in enumerate(zip(fractions, loads, strict=True)):
        first = group[0]
        decided = profile_plan(config, first.workload_dir)  # the sim phase never profiles
        if decided.misfits:
            raise ArtifactError(
                f"{config.profiling_root}: the bundle does not cover {first.label} "
                f"({first.workload_dir}): "
                + "; ".join(decided.misfits)
                + ". Profile it (a pipeline run with this model, hardware and backend), point "
                "profiling_root= at a bundle that covers it, or pass engine_overhead=false "
                "(Vidur's per-op model alone) where the engine calibration is what is missing"
            )
        planned.append(
            {
                "load_fraction": fraction,
                "offered_qps": first.offered_qps,
                "num_requests": len(first.requests),
                "warmup_s": warmup_s,
                "run_id": f"{backend}-load{index}",
                "workload_dir": str(first.workload_dir),
                "real_dir": str(first.real_dir),
                "repeat_dirs": [str(run.real_dir) for run in group[1:]],
                "scheduler": {},  # nothing recorded: the derived one is not checked
                "imported_label": first.label,
            }
        )
    return planned


def describe_import(
    src: Path,
    data: dict[str, Any],
    runs: list[ImportedRunDirs],
    loads: list[list[ImportedRunDirs]],
    fractions: list[float],
    capacity: dict[str, Any],
    backend: str,
) -> tuple[dict[str, Any], list[str]]:
    """What the report says of the import (``imported``: each run's role, the capacity's source,
    the checks an import cannot have) and its notes (bursts left out, the tool's conventions
    the file contradicts)."""
    role = {run.index: f"load {i}" for i, g in enumerate(loads) for run in g[:1]}
    role |= {run.index: f"load {i}, real repeat" for i, g in enumerate(loads) for run in g[1:]}
    bursts = [run for run in runs if run.burst]
    if bursts and capacity["probe_run"]:
        role[bursts[0].index] = "capacity"
    notes = [
        f"imported burst {run.label} left out (requests sent at once: no offered rate to "
        "simulate it at)"
        for run in bursts
        if run.index not in role
    ]
    for entry in data["runs"]:
        for line in entry.get("disagreements") or ():
            notes.append(f"the imported file contradicts its tool's conventions: {line}")
    tool = str(data.get("tool") or "?")
    source = data.get("source") or {}
    imported = {
        "tool": tool,
        "file": source.get("path"),
        "sha256": source.get("sha256"),
        "import_run": str(src),
        "capacity_source": capacity["source"],
        "scheduler_check": "not made: an import records no engine config; the Vidur scheduler "
        f"is derived from this command's backend={backend}",
        "noise_floor": noise_floor(loads, fractions),
        "disturbance": f"not judged: {tool} records no signs of a disturbed run",
        "runs": [
            {
                "run": run.label,
                "role": role.get(run.index, "left out"),
                "num_requests": len(run.requests),
                "offered_qps": run.offered_qps if math.isfinite(run.offered_qps) else None,
                "nominal_qps": run.nominal_qps,
                "real_dir": str(run.real_dir),
            }
            for run in runs
        ],
    }
    return imported, notes
