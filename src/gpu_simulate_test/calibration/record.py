"""What a simulation reads of a bundle's engine calibration beyond its step costs: the spread
of single steps and the front end (its input delay, its constant output delay, its queue), each
checked with an error naming the bundle's ``meta.json`` and the key."""

from __future__ import annotations

from gpu_simulate_test.calibration import overhead
from gpu_simulate_test.calibration.frontend_queue import FrontEndQueue
from gpu_simulate_test.core.bundle import Bundle
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError


def load_step_jitter(bundle: Bundle, backend: str) -> overhead.StepJitter:
    """The step spread ``backend``'s calibration recorded; ArtifactError when there is none."""
    where = f"{bundle.path / layout.BUNDLE_META}: engine_calibration.{backend}.step_jitter"
    recorded = (bundle.engine_calibration(backend) or {}).get("step_jitter")
    if recorded is None:
        raise ArtifactError(
            f"{where} is missing (a calibration before version 4, or one without decode steps); "
            f"profile again with engine.enable=true engine.backend.name={backend}, or set "
            "vidur.step_jitter=false"
        )
    try:
        return overhead.StepJitter.from_calibration(recorded, where)
    except ValueError as exc:
        raise ArtifactError(str(exc)) from exc


def load_frontend_queue(bundle: Bundle, backend: str) -> FrontEndQueue | None:
    """The front end's queue ``backend``'s calibration fitted (None: none, e.g. a calibration
    before version 8 or without replays under load)."""
    where = f"{bundle.path / layout.BUNDLE_META}: engine_calibration.{backend}.frontend.queue"
    recorded = ((bundle.engine_calibration(backend) or {}).get("frontend") or {}).get("queue")
    if recorded is None:
        return None
    try:
        return FrontEndQueue.from_calibration(recorded, where)
    except ValueError as exc:
        raise ArtifactError(str(exc)) from exc


def load_frontend(bundle: Bundle, backend: str) -> overhead.FrontEnd | None:
    """The front-end latency ``backend``'s calibration measured (None: it measured none, e.g.
    an in-process engine, or a calibration by client token times)."""
    where = f"{bundle.path / layout.BUNDLE_META}: engine_calibration.{backend}.frontend"
    recorded = (bundle.engine_calibration(backend) or {}).get("frontend")
    if recorded is None:
        return None
    try:
        return overhead.FrontEnd.from_calibration(recorded, where)
    except ValueError as exc:
        raise ArtifactError(str(exc)) from exc
