"""What a simulation takes from a real run of its workload: the arrivals its client actually
sent (``arrivals_from``, :func:`actual_arrivals`) and an oracle replay's scheduler knobs
(``step_times_from``, :func:`with_run_knobs`).

``step_times_from=<real_bench run>`` follows a vLLM server's own steps, so the simulated scheduler
must be that server's: ``vidur.scheduler.name=vllm_v1`` and the server's knobs, which the run's
``run_meta.json`` holds (``config.backend``, paired with Vidur's knobs as everywhere else,
:data:`gpu_simulate_test.core.engines.knobs.HF_CB_PAIRS`):

- ``chunk_size`` ← ``max_num_batched_tokens`` (``--max-num-batched-tokens``),
- ``batch_size_cap`` ← ``max_num_seqs`` (``--max-num-seqs``),
- ``block_size`` ← ``block_size``,
- ``num_blocks`` ← ``num_gpu_blocks_override`` (``--num-gpu-blocks-override``, always given: the
  backend config requires it ``>= 1``),
- ``enable_prefix_caching`` ← ``enable_prefix_caching``.

**Given or left out**: a knob is taken as given when its value differs from
:class:`~gpu_simulate_test.config.vidur.VidurSchedulerConfig`'s default (the stage's YAML sets
none; an experiment bundle that sets one gives it). A knob left at its default, or set to it, is
taken from the run; a given knob that contradicts the run is refused by name. This needs no
Hydra in the library (the typed config is all the stage sees); its one blind spot is a knob set
on the command line to its default value, which is then replaced by the run's without a word.
The run records what it simulated: :func:`recorded_config` puts the knobs taken into the
resolved config its ``run_meta.json`` keeps.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from gpu_simulate_test.config.renamed import RENAMED_KNOBS, current_names
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.vidur import VidurSchedulerConfig, VidurSimulateStageConfig
from gpu_simulate_test.core.engines.knobs import HF_CB_PAIRS, VLLM_BACKENDS
from gpu_simulate_test.core.run_inputs import load_run
from gpu_simulate_test.core.traffic.workloads import LoadedWorkload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.io.runs import open_upstream_run
from gpu_simulate_test.simulator.types import NAME as V1_NAME

DEFAULTS = VidurSchedulerConfig()
"""The schema's defaults: a knob at its default counts as not given."""


def run_knobs(run_dir: str | Path) -> dict[str, tuple[Any, str]]:
    """Vidur's scheduler knobs of the real vLLM run ``run_dir``: knob → (value, where the run
    recorded it). A knob the run did not record is absent. ArtifactError for a run that is not
    complete or not of a vLLM backend."""
    meta = open_upstream_run(run_dir, "real_bench")
    where = Path(run_dir) / layout.RUN_META
    config = meta.get("config") or {}
    recorded = (config.get("backend") or {}) if isinstance(config, Mapping) else config
    if not isinstance(recorded, Mapping):
        field, what = (
            ("config.backend", "the backend's knobs")
            if isinstance(config, Mapping)
            else ("config", "the run's config")
        )
        raise ArtifactError(
            f"step_times_from={run_dir}: {where}, field '{field}': expected {what} as an "
            f"object, got {recorded!r:.60}"
        )
    backend = current_names(recorded)
    name = backend.get("name")
    if name not in VLLM_BACKENDS:
        raise ArtifactError(
            f"step_times_from={run_dir}: "
            + (f"a {name} run" if name else "a run with no backend named (an imported one?)")
            + f" ({where}, field 'config.backend.name'); "
            "an oracle replay follows vLLM's own steps (a run of backend "
            f"{' or '.join(VLLM_BACKENDS)})"
        )
    knobs: dict[str, tuple[Any, str]] = {"name": (V1_NAME, f"backend {name}")}
    for real, vidur in HF_CB_PAIRS:
        value = backend.get(real)
        if value is None:  # not recorded
            continue
        if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            field = next((k for k in recorded if RENAMED_KNOBS.get(k, k) == real), real)
            raise ArtifactError(
                f"step_times_from={run_dir}: {where}, field 'config.backend.{field}' (Vidur's "
                f"{vidur}): expected a whole number >= 1, got {value!r}"
            )
        knobs[vidur] = (value, f"backend.{real}")
    caching = backend.get("enable_prefix_caching")
    if caching is not None and not isinstance(caching, bool):
        raise ArtifactError(
            f"step_times_from={run_dir}: {where}, field 'config.backend.enable_prefix_caching': "
            f"expected true or false, got {caching!r}"
        )
    if caching is not None:
        knobs["enable_prefix_caching"] = (caching, "backend.enable_prefix_caching")
    return knobs


def with_run_knobs(cfg: VidurSimulateStageConfig) -> VidurSimulateStageConfig:
    """``cfg`` with the scheduler knobs of its ``step_times_from`` run (unchanged without one);
    ConfigError, one line naming the knob, the run's value and the given one, when a knob given
    explicitly contradicts the run."""
    if not cfg.step_times_from:
        return cfg
    given = cfg.vidur.scheduler
    taken: dict[str, Any] = {}
    for knob, (value, source) in run_knobs(cfg.step_times_from).items():
        mine, default = getattr(given, knob), getattr(DEFAULTS, knob)
        if mine != default and mine != value:
            raise ConfigError(
                f"vidur.scheduler.{knob}={mine} contradicts the run step_times_from="
                f"{cfg.step_times_from}, whose {source} gives {knob}={value}: leave "
                f"vidur.scheduler.{knob} out (an oracle replay takes it from the run)"
            )
        taken[knob] = value
    scheduler = dataclasses.replace(given, **taken)
    return dataclasses.replace(cfg, vidur=dataclasses.replace(cfg.vidur, scheduler=scheduler))


def recorded_config(resolved: Mapping[str, Any], cfg: VidurSimulateStageConfig) -> dict[str, Any]:
    """``resolved`` (the config as composed) with ``vidur.scheduler`` set to ``cfg``'s (the
    effective knobs, :func:`with_run_knobs`) where they differ: what the run simulated, for its
    ``run_meta.json`` ``config``. A run that took nothing from a real run keeps ``resolved``
    as it was, key for key."""
    if not cfg.step_times_from:
        return dict(resolved)
    vidur = resolved.get("vidur") or {}
    given = vidur.get("scheduler") or {}
    changed = {
        k: v for k, v in dataclasses.asdict(cfg.vidur.scheduler).items() if given.get(k) != v
    }
    if not changed:
        return dict(resolved)
    return {**resolved, "vidur": {**vidur, "scheduler": {**given, **changed}}}


def actual_arrivals(real_run: str, workload: LoadedWorkload, scheduled: np.ndarray) -> np.ndarray:
    """The arrival times a real run of ``workload`` actually sent its requests at, in the
    workload's request order; a request it did not send keeps its ``scheduled`` time.

    Sends happen one after another, so actual arrivals keep the workload's order. A multi-turn
    session's later turns keep no arrival: the simulation sends them in its closed loop."""
    run = load_run(real_run, "real_bench")
    if run.workload_id != workload.workload_id:
        raise ArtifactError(
            f"arrivals_from={real_run} replayed workload {run.workload_id}, not "
            f"{workload.workload_id} ({workload.path})"
        )
    sent = dict(
        zip(
            run.requests["request_id"].astype(int).tolist(),
            run.requests["arrival_time_s"].astype(float).tolist(),
            strict=True,
        )
    )
    ids = workload.intervals["request_id"].astype(int).tolist()
    actual = np.array(
        [sent.get(rid, sched) for rid, sched in zip(ids, scheduled.tolist(), strict=True)]
    )
    if workload.sessions is not None:
        actual[workload.sessions.turn > 0] = np.nan
    known = ~np.isnan(actual)
    actual[known] = np.maximum.accumulate(np.maximum(actual[known], 0.0))
    return actual
