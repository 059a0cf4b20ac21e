"""The manifest of a fidelity run's real phase: what was measured, where, with which config.

``fidelity.phase=real`` (on the GPU machine) writes it into its run directory after the probe and
after every load, marked incomplete until the end; ``fidelity.phase=sim`` reads it back (the run
directory may have been tarred and moved: every path in it is relative to that directory). The
writing, the paths and the reader's checks are the one hand-off's
(:mod:`gpu_simulate_test.io.handoff`); this module keeps what the fidelity stage records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_simulate_test.fidelity.tables import LOAD_FRACTIONS, load_levels
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.io.handoff import (
    HandoffFormat,
    read_handoff,
    relative,
    require,
    write_handoff,
)

MANIFEST_FILE = "fidelity-manifest.json"
MANIFEST_VERSION = 2
"""2: the fidelity stage (the backend's resolved config, configurable load fractions); 1 was the
argparse harness's (Hydra overrides), which the stage cannot replay."""
FORMAT = HandoffFormat(
    file=MANIFEST_FILE,
    version=MANIFEST_VERSION,
    required=("name", "backends", "requests_per_load", "load_fractions"),
    made_by="a fidelity.phase=real run (tmp/fidelity/<run_id>) or of a bench_import "
    "(tmp/bench_import/<run_id>)",
    refused={
        1: "a manifest of version 1 comes from the old benchmarks/fidelity.py harness: run its "
        "real phase again with python -m gpu_simulate_test.cli.fidelity fidelity.phase=real"
    },
)
"""The real phase's hand-off (:mod:`gpu_simulate_test.io.handoff`)."""
LOAD_KEYS = ("load_fraction", "offered_qps", "run_id", "workload_dir", "real_dir", "scheduler")
"""The fields every load of the manifest has."""


@dataclass(frozen=True)
class PlannedLoad:
    """One load of the split run: where its real runs are (relative to the manifest's root)."""

    backend: str
    index: int
    load_fraction: float
    offered_qps: float
    run_id: str
    workload_dir: str
    real_dir: str
    scheduler: Mapping[str, Any]
    """Vidur scheduler knobs derived from the backend at profile time (re-derived and checked
    by the sim phase); empty for an import (:mod:`.imported`), which records none."""
    repeat_dirs: tuple[str, ...] = ()
    """The real bench run again on the same workload (the noise floor), if asked for."""
    profiling_root: str = ""
    """This load's own bundle root (``fidelity.calibrate_each_load``); empty: the backend's."""
    warmup_s: float = 0.0
    """Seconds of the load's first arrivals left out of every figure (0: a real phase older
    than the warm-up)."""
    truth: tuple[Mapping[str, Any], ...] = ()
    """Per real run (the first, then each repeat): its attempts and the real bench's
    disturbance verdict on each (:class:`gpu_simulate_test.orchestrate.truth.Truth`); empty in
    a manifest written before disturbed runs were marked."""


def _truth_relative(truth: Mapping[str, Any], root: Path) -> dict[str, Any]:
    """A :class:`~gpu_simulate_test.orchestrate.truth.Truth` record with its paths made
    relative to ``root``."""
    return {
        **dict(truth),
        "real_dir": relative(truth["real_dir"], root),
        "attempts": [
            {**dict(a), "real_dir": relative(a["real_dir"], root)} for a in truth["attempts"]
        ],
    }


def make_manifest(
    root: str | Path,
    *,
    name: str,
    command: str,
    environment: Mapping[str, Any],
    requests_per_load: int,
    wall_time_s: float,
    backends: Mapping[str, Mapping[str, Any]],
    load_fractions: Sequence[float] = LOAD_FRACTIONS,
    complete: bool = True,
    load_duration_s: float = 0.0,
    warmup_s: float = 0.0,
) -> dict[str, Any]:
    """The real phase's manifest (``complete``: every load ran; a real phase writes an
    incomplete one after each load, so one stopped part-way still leaves the loads it measured).
    ``backends[b]`` holds ``config`` (the pipeline config the loads were built from, as stored
    JSON), ``profiling_root``, ``capacity`` (with ``probe_run``, None when the capacity was
    given) and ``loads`` (``load_fraction``, ``offered_qps``, ``run_id``, ``workload_dir``,
    ``real_dir``, ``repeat_dirs``, ``scheduler``, and ``profiling_root`` when the load has its
    own bundle); every path under ``root`` is made relative to it, so the directory can be
    moved (one outside it stays absolute: a shared bundle that ``fidelity.phase=all`` reuses is
    read where it was made)."""
    root = Path(root)
    out: dict[str, Any] = {}
    for backend, rec in backends.items():
        capacity = dict(rec["capacity"])
        if capacity.get("probe_run"):
            capacity["probe_run"] = relative(capacity["probe_run"], root)
        if capacity.get("truth"):
            capacity["truth"] = _truth_relative(capacity["truth"], root)
        out[backend] = {
            "config": dict(rec["config"]),
            "profiling_root": relative(rec["profiling_root"], root),
            "capacity": capacity,
            "loads": [
                {
                    **dict(load),
                    "workload_dir": relative(load["workload_dir"], root),
                    "real_dir": relative(load["real_dir"], root),
                    "repeat_dirs": [relative(d, root) for d in load.get("repeat_dirs", ())],
                    "scheduler": dict(load["scheduler"]),
                    "truth": [_truth_relative(t, root) for t in load.get("truth", ())],
                    **(
                        {"profiling_root": relative(load["profiling_root"], root)}
                        if load.get("profiling_root")
                        else {}
                    ),
                }
                for load in rec["loads"]
            ],
        }
    return {  # manifest_version: write_manifest adds it
        "name": name,
        "command": command,
        **dict(environment),
        "requests_per_load": requests_per_load,
        "load_duration_s": load_duration_s,
        "warmup_s": warmup_s,
        "load_fractions": [float(f) for f in load_fractions],
        "wall_time_s": wall_time_s,
        "complete": complete,
        "backends": out,
    }


def write_manifest(root: str | Path, manifest: Mapping[str, Any]) -> Path:
    """Write the manifest atomically (a killed real phase leaves none, not half of one), after
    the loads it names."""
    return write_handoff(root, FORMAT, manifest)


def read_manifest(root: str | Path) -> dict[str, Any]:
    """The manifest under ``root``; ArtifactError (naming the file and the field) when it is
    missing, of another version, lacks a key, or its loads are not its capacity's levels."""
    manifest = read_handoff(root, FORMAT)
    path = Path(root) / MANIFEST_FILE
    complete = manifest.get("complete", True)
    fractions = [float(f) for f in manifest["load_fractions"]]
    require(manifest["backends"], (), path, "backends")
    for backend, rec in manifest["backends"].items():
        where = f"backends.{backend}"
        require(rec, ("config", "profiling_root", "capacity", "loads"), path, where)
        require(rec["capacity"], ("capacity_qps",), path, f"{where}.capacity")
        for index, load in enumerate(rec["loads"]):
            require(load, LOAD_KEYS, path, f"{where}.loads[{index}]")
        want = load_levels(float(rec["capacity"]["capacity_qps"]), fractions)
        got = [(float(x["load_fraction"]), float(x["offered_qps"])) for x in rec["loads"]]
        if got != want[: len(got)] or (complete and len(got) != len(want)):
            what = "the levels" if complete else "the first of the levels"
            raise ArtifactError(
                f"{path}: backends.{backend}.loads {got} are not {what} {want} of its capacity"
            )
    return manifest


def missing_loads(manifest: Mapping[str, Any]) -> dict[str, int]:
    """Per backend, how many load levels an incomplete real phase did not run."""
    fractions = manifest.get("load_fractions", LOAD_FRACTIONS)
    left = {
        str(backend): len(load_levels(float(rec["capacity"]["capacity_qps"]), fractions))
        - len(rec["loads"])
        for backend, rec in manifest["backends"].items()
    }
    return {backend: n for backend, n in left.items() if n > 0}


def load_plan(manifest: Mapping[str, Any]) -> list[PlannedLoad]:
    """Every backend's loads, in the manifest's order."""
    return [
        PlannedLoad(
            backend=str(backend),
            index=index,
            load_fraction=float(load["load_fraction"]),
            offered_qps=float(load["offered_qps"]),
            run_id=str(load["run_id"]),
            workload_dir=str(load["workload_dir"]),
            real_dir=str(load["real_dir"]),
            scheduler=dict(load["scheduler"]),
            repeat_dirs=tuple(str(d) for d in load.get("repeat_dirs", ())),
            profiling_root=str(load.get("profiling_root", "")),
            warmup_s=float(load.get("warmup_s", 0.0)),
            truth=tuple(dict(t) for t in load.get("truth", ())),
        )
        for backend, rec in manifest["backends"].items()
        for index, load in enumerate(rec["loads"])
    ]
