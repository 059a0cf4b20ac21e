"""The engine calibration's record: what a bundle holds of one backend's calibration, typed,
versioned and checked once.

A calibration (:func:`.engine_steps.calibrate`) leaves three things in the bundle, written by the
vidur_profile stage: its rows of ``engine_steps.csv`` (one per experiment), its rows of
``serving_steps.csv`` (the replays under load, where it ran them) and its entry in ``meta.json``
``engine_calibration.<backend>`` (the knobs, the engine, the spread of single steps, the front
end, the host's memory speed, ...). :meth:`CalibrationRecord.load` reads the three into one
frozen record; every error names the file and the key. The simulator reads the record, never
the files, and uses the calibration's fits as public APIs (:mod:`.overhead`, :mod:`.serving_load`,
:mod:`.frontend_queue`), never its plan or drive (:mod:`.experiments`, :mod:`.engine_steps`,
:mod:`.frontend`, :mod:`.serving_replay`); ``compare`` reads what a simulation says of the record
it used (:class:`SimulatedCalibration`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pandas as pd

from gpu_simulate_test.calibration.frontend_queue import FrontEndQueue
from gpu_simulate_test.calibration.overhead import FrontEnd, StepJitter
from gpu_simulate_test.core.profiling.bundle import Bundle
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError

CALIBRATION_VERSION = 21
"""Bumped when what the calibration measures changes (2: every batch size up to 16, mixed
steps; 3: at least 64 timed steps per decode row; 4: the spread of decode steps,
``step_jitter``, and the experiments interleaved in rounds; 5: on an engine that logs its steps
(vLLM), step times from that log and the front end's latency apart; 6: on a vLLM server that
records its steps, step times and the front end from the engine's own clock, the log's reading
kept as a check; 7: calibration replays under load, ``serving_steps.csv``; 8: the front end
as a queue fitted on those replays, ``frontend.queue``; 9: after a warm-up of every step size,
:func:`~.engine_steps.calibration_shapes`; 10: with vLLM's prefix caching, prefills over a
cached prefix, ``cached_prefill``; 11: bursts of 2, 4 and 8 prompts read step by step
(``num_prompts``), decodes at the middle and longest context, and the front end's input line
fitted on the replays under load; 12: the client's sends beside the replays' steps,
``serving_steps.csv`` ``client_sends``, for the intake a send adds to the step it falls in, and
the input hops' spread around the line per load, ``frontend.input_residual_ms``; 13: a
stream's first chunk's extra delay on the way back, ``frontend.queue.first_ms``; 14: the way
in of a request sent to an idle engine apart from the input line, ``frontend.input_idle_ms``,
the line fitted on the other sends; 15: the input line fitted through the recorded steps,
``frontend.input_through_steps``, not through the middles of the held requests' windows; 16:
the first token's way back of a request sent to an idle engine, its spread around the queue's,
``frontend.queue.first_idle_residual_ms``, and a replay at 2% of capacity for the wake-ups
after long idles; 17: how far into its step each of the replays' sends fell,
``serving_steps.csv`` ``client_send_offsets_ms``, for the step's free part, where a send adds
nothing; 18: the first token's way back of a request sent to a busy engine, its spread around
the queue's per bucket of requests in flight, ``frontend.queue.first_busy_residual_ms``; 19:
the way in of a request sent to a busy engine, its spread around the line fitted through the
engine's steps, ``frontend.busy_hop_residual_ms``; 20: that spread with every stamp of an
engine that had other requests read as a drain between steps, not an arrival; 21: the
replays recorded with a request's queued stamp written with its step's line, not between two
steps, where the write held back the step after it by about a millisecond in about half of the
steps that took a request in, ``core/engines/vllm_recording_scheduler.py``); a bundle calibrated
by another version is not reused by the pipeline, one by a later version is not read."""


MEASURED_SINCE: Mapping[int, str] = MappingProxyType(
    {
        7: "replays under load (serving_steps.csv: the step time under load)",
        8: "the front end as a queue (frontend.queue)",
        9: "a warm-up of every step size before the timed steps",
        10: "prefills over a cached prefix (cached_prefill)",
        11: "bursts of 2, 4 and 8 prompts, decodes at the middle and longest context, and the "
        "front end's input hop under load",
        12: "the client's sends beside the replays' steps (serving_steps.csv client_sends: "
        "the API server's intake of a request, added to the step it falls in) and the input "
        "hops' spread around the line (frontend.input_residual_ms)",
        13: "a stream's first chunk's extra delay on the way back (frontend.queue.first_ms)",
        14: "the way in of a request sent to an idle engine, apart from the input line "
        "(frontend.input_idle_ms)",
        15: "the input line fitted through the engine's recorded steps, not the middles of the "
        "held requests' windows (frontend.input_through_steps)",
        16: "the spread of an idle engine's first token's way back around the queue's "
        "(frontend.queue.first_idle_residual_ms), and a replay at 2% of capacity for the "
        "wake-ups after long idles",
        17: "how far into its step each of the replays' sends fell (serving_steps.csv "
        "client_send_offsets_ms: a send in the step's first part adds no intake)",
        18: "the spread of a busy engine's first token's way back around the queue's, per "
        "bucket of requests in flight (frontend.queue.first_busy_residual_ms)",
        19: "the spread of a busy engine's way in around the input line, fitted through the "
        "engine's steps (frontend.busy_hop_residual_ms)",
        20: "that spread with a working engine's late stamps read as drains between steps, "
        "not arrivals (frontend.busy_hop_residual_ms)",
        21: "the replays' steps recorded with no write between two steps (a request's "
        "queued stamp written with its step's line): the pause before a step that takes a "
        "request in as vLLM's own",
    }
)
"""What each version of the calibration began to measure (:data:`CALIBRATION_VERSION`'s
history, from the replays under load on)."""


def measured_since(version: int) -> list[str]:
    """What the calibrations after ``version`` measure that it does not, oldest first."""
    missing = [what for v, what in sorted(MEASURED_SINCE.items()) if v > version]
    first, last = version + 1, min(MEASURED_SINCE) - 1
    if first < last:
        missing.insert(0, f"what versions {first} to {last} added (CALIBRATION_VERSION)")
    elif first == last:
        missing.insert(0, f"what version {first} added (CALIBRATION_VERSION)")
    return missing


@dataclass(frozen=True)
class CalibrationRecord:
    """One backend's engine calibration as its bundle holds it (:meth:`load`)."""

    bundle_path: Path
    backend: str
    version: int | None
    """:data:`CALIBRATION_VERSION` of the code that calibrated (None: not recorded)."""
    settings: Mapping[str, Any]
    """The calibration's knobs (``engine.*``, its backend's among them), as stored."""
    engine: Mapping[str, Any]
    """What the engine said of itself (its version, a server's flags)."""
    dtype: str | None
    steps: pd.DataFrame
    """This backend's rows of ``engine_steps.csv``."""
    serving_steps: pd.DataFrame | None
    """This backend's rows of ``serving_steps.csv`` (None: no replays under load)."""
    step_times_from: str | None
    """Client token times, engine step log or engine step record."""
    step_jitter: StepJitter | None
    """The spread of single decode steps (None: before version 4, or no decode steps)."""
    frontend: FrontEnd | None
    """The front end's latency (None: none measured, e.g. an in-process engine)."""
    frontend_queue: FrontEndQueue | None
    """The front end as a queue (None: before version 8, or no replays under load)."""
    serving: Mapping[str, Any] | None
    """What the replays under load ran, their residual analysis and drift (None: none ran)."""
    host_probe: Mapping[str, Any] | None
    """The host's memory speed around the calibration (None: not read)."""
    info: Mapping[str, Any]
    """The whole ``meta.json`` entry, as written."""

    def where(self, key: str) -> str:
        """``<bundle>/meta.json: engine_calibration.<backend>.<key>``, for errors."""
        return where(self.bundle_path, self.backend, key)

    def require_step_jitter(self) -> StepJitter:
        """:attr:`step_jitter`; ArtifactError when the calibration recorded none."""
        if self.step_jitter is None:
            raise ArtifactError(
                f"{self.where('step_jitter')} is missing (a calibration before version 4, or one "
                "without decode steps); profile again with engine.enable=true "
                f"engine.backend.name={self.backend}, or set vidur.step_jitter=false"
            )
        return self.step_jitter

    @classmethod
    def load(cls, bundle: Bundle, backend: str) -> CalibrationRecord:
        """``backend``'s calibration in ``bundle``; ArtifactError naming the file and the key
        when there is none, or a table or a field is not what this version writes."""
        steps = bundle.engine_steps(backend)  # names the missing calibration or its bad rows
        info = bundle.engine_calibration(backend)
        assert info is not None  # engine_steps refused a bundle without it
        version = info.get("version")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)):
            raise ArtifactError(f"{where(bundle.path, backend, 'version')}: expected an integer")
        if version is not None and version > CALIBRATION_VERSION:
            raise ArtifactError(
                f"{where(bundle.path, backend, 'version')}: {version}, made by a later version "
                f"of this code (it reads up to {CALIBRATION_VERSION}); update it, or profile again"
            )
        frontend = _parsed(FrontEnd, info.get("frontend"), where(bundle.path, backend, "frontend"))
        return cls(
            bundle_path=bundle.path,
            backend=backend,
            version=version,
            settings=_mapping(info, "settings", bundle.path, backend) or {},
            engine=_mapping(info, "engine", bundle.path, backend) or {},
            dtype=_text(info, "dtype", bundle.path, backend),
            steps=steps,
            serving_steps=bundle.serving_steps(backend),
            step_times_from=_text(info, "step_times_from", bundle.path, backend),
            step_jitter=_parsed(
                StepJitter, info.get("step_jitter"), where(bundle.path, backend, "step_jitter")
            ),
            frontend=frontend,
            frontend_queue=None
            if frontend is None
            else _parsed(
                FrontEndQueue,
                info["frontend"].get("queue"),
                where(bundle.path, backend, "frontend.queue"),
            ),
            serving=_mapping(info, "serving", bundle.path, backend),
            host_probe=_mapping(info, "host_probe", bundle.path, backend),
            info=info,
        )


def where(bundle_path: Path, backend: str, key: str) -> str:
    """``<bundle>/meta.json: engine_calibration.<backend>.<key>``, for errors."""
    return f"{bundle_path / layout.BUNDLE_META}: engine_calibration.{backend}.{key}"


def _parsed(kind: Any, recorded: Any, at: str) -> Any:
    """``kind.from_calibration(recorded)`` (None for None); its ValueError as ArtifactError."""
    if recorded is None:
        return None
    try:
        return kind.from_calibration(recorded, at)
    except ValueError as exc:
        raise ArtifactError(str(exc)) from exc


def _mapping(
    info: Mapping[str, Any], key: str, bundle_path: Path, backend: str
) -> Mapping[str, Any] | None:
    value = info.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise ArtifactError(
            f"{where(bundle_path, backend, key)}: expected a mapping, got {type(value).__name__}"
        )
    return value


def _text(info: Mapping[str, Any], key: str, bundle_path: Path, backend: str) -> str | None:
    value = info.get(key)
    if value is not None and not isinstance(value, str):
        raise ArtifactError(
            f"{where(bundle_path, backend, key)}: expected a string, got {type(value).__name__}"
        )
    return value


@dataclass(frozen=True)
class SimulatedCalibration:
    """What a simulation's ``run_meta.json`` says of the calibration it used
    (:meth:`from_run_meta`): the fitted engine overhead, the front end it applied and the
    calibration's host reading, as ``compare`` sets them against the real run."""

    engine_overhead: Mapping[str, Any] | None
    """The overhead fit (``engine_overhead``: its calibration error by phase, its ops scales);
    None: no overhead."""
    frontend: Mapping[str, Any] | None
    """The front end applied (``frontend``; None: not modelled)."""
    mean_frontend_input_ms: float | None
    mean_frontend_output_ms: float | None
    """The queue's mean delivery delay (None: the front end's constant ``output_ms``)."""
    host_probe: Mapping[str, Any] | None
    """The calibration's host reading (``calibration_host_probe``; None: not read)."""

    @classmethod
    def from_run_meta(cls, meta: Mapping[str, Any]) -> SimulatedCalibration:
        """From a vidur_simulate run's ``run_meta.json`` (a key of the wrong kind reads as
        absent: a simulation from before it was recorded)."""
        fitted, frontend = meta.get("engine_overhead"), meta.get("frontend")
        probe = meta.get("calibration_host_probe")
        input_ms, output_ms = (
            meta.get("mean_frontend_input_ms"),
            meta.get("mean_frontend_output_ms"),
        )
        return cls(
            engine_overhead=fitted if isinstance(fitted, Mapping) else None,
            frontend=frontend if isinstance(frontend, dict) else None,
            mean_frontend_input_ms=None if input_ms is None else float(input_ms),
            mean_frontend_output_ms=None if output_ms is None else float(output_ms),
            host_probe=probe if isinstance(probe, Mapping) else None,
        )

    @property
    def frontend_ttft_ms(self) -> float | None:
        """What the front end added to a request's TTFT on average (input and output); None
        without a front end."""
        if self.frontend is None or self.mean_frontend_input_ms is None:
            return None
        output = self.mean_frontend_output_ms  # the queue's, or the constant
        return self.mean_frontend_input_ms + float(
            output if output is not None else self.frontend.get("output_ms", 0.0)
        )
