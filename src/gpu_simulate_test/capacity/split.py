"""The capacity search split in two: ``capacity.phase=real`` runs the real search where the
engine is (the GPU machine, which has no Vidur), ``capacity.phase=sim`` simulates it anywhere.

The real phase writes ``capacity-real.json`` into its run directory: the pipeline config it ran
(``as_resolved``), the bundle it used (copied into ``runs/profiles``, so that the directory
travels whole), the workload the search scaled, the scheduler knobs derived from the backend, the
goals, and the real search itself (how it was seeded, its knobs, where its budget stopped it,
every rate's percentiles and verdict, its runs). Every path in it is relative to that directory,
which may be tarred and moved. The sim phase reads it back, re-derives the scheduler from the
recorded config and checks it, and refuses goals other than the ones the real search was judged
by. Its simulated search runs its own grid; the real rates it did not simulate are simulated
too, for the latency agreement. The manifest is written and read through the one
hand-off (:mod:`gpu_simulate_test.io.handoff`), as the fidelity stage's.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_simulate_test.capacity.real_search import RealSearch
from gpu_simulate_test.capacity.search import Answer, Point
from gpu_simulate_test.config.capacity import CapacityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.io.artifacts import ArtifactError, as_stored_json
from gpu_simulate_test.io.handoff import (
    HandoffFormat,
    read_handoff,
    relative,
    resolve,
    write_handoff,
)
from gpu_simulate_test.io.runs import Run, open_upstream_run
from gpu_simulate_test.orchestrate.configs import as_resolved, recorded_pipeline, with_workload
from gpu_simulate_test.orchestrate.profiling import (
    ProfilePlan,
    carry_bundle,
    ensure_bundle,
    profile_plan,
    recorded_plan,
)
from gpu_simulate_test.orchestrate.serving import served
from gpu_simulate_test.orchestrate.steps import QUIET, make_workload

REFERENCE_QPS = 1.0
"""The rate the one workload is built at; each rate the search tries scales its arrivals."""
MANIFEST_FILE = "capacity-real.json"
MANIFEST_VERSION = 2
"""2: the real search is seeded and sized by time (``search``: its seed, knobs and budget stop;
each run's requests and seconds) instead of replaying the simulated search's grid."""
MANIFEST_KEYS = (
    "config", "profiling_root", "workload_dir", "scheduler", "slo", "search", "wall_time_s",
    "measured", "runs",
)  # fmt: skip
FORMAT = HandoffFormat(
    file=MANIFEST_FILE,
    version=MANIFEST_VERSION,
    required=MANIFEST_KEYS,
    made_by="a capacity.phase=real run that finished (tmp/capacity/<run_id>)",
    refused={
        1: "its real search replayed the simulated grid with a fixed count per rate; run the "
        "real phase again (capacity.phase=real) for a search seeded and sized by time"
    },
)
"""The real phase's hand-off (:mod:`gpu_simulate_test.io.handoff`); every path in it lies inside
the run directory (the bundle is carried there), so that it travels whole."""
PROFILES_DIR = "runs/profiles"
"""Where the real phase puts a copy of its bundle (``<hardware>/<model>`` under it)."""


@dataclass(frozen=True)
class RealSource:
    """A real phase's run, read back for the sim phase (paths resolved against its directory)."""

    root: Path
    config: PipelineStageConfig
    """The pipeline config the real phase ran (its model, hardware, backend, workload)."""
    profiling_root: Path
    workload_dir: Path
    scheduler: Mapping[str, Any]
    found: RealSearch
    """The real search as recorded (its runs read where they now are)."""


def answer_record(answer: Answer) -> dict[str, Any]:
    """An :class:`Answer` as stored JSON (its points with every percentile and verdict)."""
    return dict(as_stored_json(dataclasses.asdict(answer)))


def answer_from(record: Mapping[str, Any], where: Path) -> Answer:
    """:func:`answer_record` read back; ``where`` names the file in the error."""
    try:
        points = tuple(
            Point(
                qps=float(p["qps"]),
                phase=str(p["phase"]),
                latency_ms={  # NaN (no request had the metric) is stored as null
                    k: float("nan") if v is None else float(v) for k, v in p["latency_ms"].items()
                },
                meets=bool(p["meets"]),
                violated=tuple(p.get("violated") or ()),
                wall_s=float(p.get("wall_s") or 0.0),
                goodput_qps=p.get("goodput_qps"),
            )
            for p in record["points"]
        )
        low, high = record["bracket"]
        return Answer(
            qps=None if record["qps"] is None else float(record["qps"]),
            bracket=(float(low), None if high is None else float(high)),
            points=points,
            note=str(record.get("note") or ""),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ArtifactError(
            f"{where}: field 'measured' is not a real search's answer (expected qps, bracket "
            f"and points with qps, phase, latency_ms and meets): {exc!r}"
        ) from exc


def recorded_config(cfg: CapacityStageConfig) -> dict[str, Any]:
    """The pipeline config a real phase records: a fleet's workload at its size, N times
    ``workload.num_requests`` (:func:`per_engine_requests`), as its ``workload_dir`` holds."""
    return as_resolved(per_engine_requests(cfg, cfg.pipeline()))


def write_real(
    r: Run,
    cfg: CapacityStageConfig,
    profiling_root: Path,
    workload_dir: Path,
    decided: ProfilePlan,
    found: RealSearch,
) -> Path:
    """``capacity-real.json`` of a real phase (``decided``: the plan whose scheduler it ran),
    every path relative to its run directory."""
    slo = cfg.capacity.slo
    manifest = {
        "config": recorded_config(cfg),
        "profiling_root": relative(profiling_root, r.path, inside=True),
        "workload_dir": relative(workload_dir, r.path, inside=True),
        "scheduler": as_stored_json(dataclasses.asdict(decided.scheduler)),
        "slo": {"percentile": slo.percentile, "goals_ms": slo.goals()},
        "search": as_stored_json(_probe_run(found.record(), lambda run: relative(run, r.path))),
        "wall_time_s": round(found.wall_s, 1),
        "measured": answer_record(found.measured),
        "runs": [
            {**run, "real_run": relative(run["real_run"], r.path, inside=True)}
            for run in found.runs
        ],
    }
    return write_handoff(r.path, FORMAT, manifest)


def _probe_run(search: Mapping[str, Any], moved: Callable[[str], str]) -> dict[str, Any]:
    """The real search's record (``seed``, ``plan``, ``stopped``) with its probe's run directory
    ``moved`` (made relative to the run directory, or resolved against where it now lies)."""
    seed = dict(search.get("seed") or {})
    probe = seed.get("probe")
    if isinstance(probe, Mapping) and probe.get("probe_run"):
        seed["probe"] = {**probe, "probe_run": moved(str(probe["probe_run"]))}
    return {**search, "seed": seed}


def read_real(src: Path, cfg: CapacityStageConfig) -> RealSource:
    """A real phase's run directory, checked before anything is simulated: its manifest's
    version, the goals it was judged by against ``cfg``'s, the bundle and workload it names."""
    if not src.is_dir():
        raise ArtifactError(
            f"capacity.real_from={src}: no such directory (expected the run directory of a "
            "capacity.phase=real run, tmp/capacity/<run_id>)"
        )
    where = src / MANIFEST_FILE
    if not where.is_file():
        raise ArtifactError(
            f"{where}: missing; capacity.real_from must be a capacity.phase=real run that finished"
        )
    meta = open_upstream_run(src, "capacity")  # complete, not interrupted
    if meta.get("phase") != "real":
        raise ArtifactError(
            f"{src}: is a capacity.phase={meta.get('phase', 'all')} run; capacity.real_from must "
            "be a capacity.phase=real run"
        )
    manifest = read_handoff(src, FORMAT)
    slo = cfg.capacity.slo
    mine = {"percentile": slo.percentile, "goals_ms": slo.goals()}
    if as_stored_json(mine) != manifest["slo"]:
        raise ArtifactError(
            f"{where}: the real search was judged by {manifest['slo']}, this run's goals are "
            f"{mine}: set capacity.slo.* as the real phase had them"
        )
    search = manifest["search"]
    if not isinstance(search, Mapping):
        raise ArtifactError(f"{where}: field 'search' is not a mapping (seed, plan, stopped)")
    profiling_root = resolve(manifest["profiling_root"], src)
    workload_dir = resolve(manifest["workload_dir"], src)
    for field, path in (("profiling_root", profiling_root), ("workload_dir", workload_dir)):
        if not path.is_dir():
            raise ArtifactError(f"{where}: field {field!r} names {path}, which does not exist")
    return RealSource(
        root=src,
        config=recorded_pipeline(manifest["config"], where),
        profiling_root=profiling_root,
        workload_dir=workload_dir,
        scheduler=manifest["scheduler"],
        found=RealSearch(
            measured=answer_from(manifest["measured"], where),
            runs=[
                {**run, "real_run": str(resolve(run["real_run"], src))} for run in manifest["runs"]
            ],
            wall_s=float(manifest["wall_time_s"]),
            seed=_probe_run(search, lambda run: str(resolve(run, src)))["seed"],
            plan=dict(search.get("plan") or {}),
            stopped=search.get("stopped"),
        ),
    )


def per_engine_requests(
    cfg: CapacityStageConfig, inner: PipelineStageConfig
) -> PipelineStageConfig:
    """A fleet of N (``fleet.*``) judged on N times the workload's requests (or sessions): at N
    times one engine's rate, the same requests per engine and as long a window of arrivals as
    one engine's (a tune's fleets hold them so too). A trace taken whole (0) stays whole."""
    replicas, wanted = cfg.fleet_of().replicas, inner.workload.num_requests
    if replicas == 1 or wanted <= 0:
        return inner
    workload = dataclasses.replace(inner.workload, num_requests=wanted * replicas)
    return dataclasses.replace(inner, workload=workload)


def bundle_and_workload(
    cfg: CapacityStageConfig, inner: PipelineStageConfig, r: Run, log_dir: Path | None = None
) -> tuple[PipelineStageConfig, ProfilePlan, Path]:
    """The one workload (at :data:`REFERENCE_QPS`) and the bundle that covers it, profiled
    when none does; ``phase=real`` copies the bundle into the run, so that it travels with it.
    The calibration's server logs into ``log_dir`` when given (a second calibration of the same
    run: its own log, not recorded in ``run_meta.json``), else into the run's directory."""
    base = with_workload(inner, "base", qps=REFERENCE_QPS)
    workload_dir = make_workload(base)
    decided = profile_plan(base, workload_dir)
    # the profile (and its engine calibration) talks its own progress; when it will run, a
    # vLLM engine is served for it as the pipeline serves one (the calibration counts the
    # server's CPU as its own, and its validation replay runs there); a reused bundle needs
    # no engine
    serving = (
        served(base, log_dir or r.path, None if log_dir else r, workload_dir, "the calibration")
        if decided.misfits
        else contextlib.nullcontext(base)
    )
    real_only = cfg.capacity.phase == "real"
    with serving as at_server:
        # phase=real (the GPU machine's half) never simulates: no validation replay there, as in
        # the fidelity stage's real phase; the real search judges the calibration
        profile_cfg = dataclasses.replace(
            at_server,
            progress=cfg.progress,
            validate_calibration=at_server.validate_calibration and not real_only,
        )
        ensure_bundle(profile_cfg, decided, workload_dir, QUIET)
    if real_only:
        carried = carry_bundle(inner, r.path / PROFILES_DIR)
        inner = dataclasses.replace(inner, profiling_root=str(carried))
    return inner, decided, workload_dir


def recorded_inputs(
    cfg: CapacityStageConfig, inner: PipelineStageConfig, source: RealSource
) -> tuple[PipelineStageConfig, ProfilePlan, Path]:
    """``phase=sim``: the real phase's config, bundle and workload, with this run's simulation
    knobs (``vidur``, ``engine_overhead``); its scheduler re-derived and checked, its bundle never
    re-profiled."""
    recorded = dataclasses.replace(
        source.config,
        vidur=cfg.vidur,
        engine_overhead=cfg.engine_overhead,
        output=inner.output,
        progress=False,
        profiling_root=str(source.profiling_root),
        reuse_profile=True,
    )
    decided = recorded_plan(
        with_workload(recorded, "base", qps=REFERENCE_QPS),
        source.workload_dir,
        source.scheduler,
        source.root / MANIFEST_FILE,
        "the real search's workload",
    )
    return recorded, decided, source.workload_dir
