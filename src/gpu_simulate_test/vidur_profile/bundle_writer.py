"""Writing a profiling bundle: atomically (a sibling staging directory renamed into place), with
the engine calibrations kept from the bundle it replaces and the calibration replays' report."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from gpu_simulate_test.config.vidur import VidurProfileStageConfig
from gpu_simulate_test.core.profiling.bundle import (
    ATTENTION_TABLE,
    ENGINE_STEPS_TABLE,
    MLP_TABLE,
    SERVING_STEPS_TABLE,
    load_bundle,
)
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, write_csv, write_json
from gpu_simulate_test.io.runs import RunExistsError
from gpu_simulate_test.vidur_profile.profiler import ProfileTables


class BundleExistsError(RunExistsError):
    """A bundle for this hardware and model exists already and overwriting was not allowed."""


def check_bundle_free(bundle: Path, overwrite: bool) -> None:
    if bundle.exists() and not overwrite:
        raise BundleExistsError(
            f"{bundle} already holds a profiling bundle; pass output.overwrite=true to replace it "
            "or profiling_root=<another dir>"
        )


def earlier_calibrations(
    bundle: Path, cfg: VidurProfileStageConfig, dtype: str
) -> tuple[pd.DataFrame | None, dict[str, Any]]:
    """Engine calibrations of other backends in the bundle being replaced (same model and
    ``dtype``), kept."""
    if not bundle.is_dir():
        return None, {}
    try:
        old = load_bundle(bundle, cfg.model, timings_checked=False)  # about to be replaced
    except ArtifactError:
        return None, {}
    if old.meta.get("dtype") != dtype:
        return None, {}
    keep = {
        name: info
        for name, info in old.meta.get("engine_calibration", {}).items()
        if not (cfg.engine.enable and name == cfg.engine.backend.name)
    }
    frames = []
    for name in keep:
        try:
            frames.append(old.engine_steps(name))
        except ArtifactError:
            continue
    if not frames:
        return None, {}
    kept = pd.concat(frames, ignore_index=True)
    return kept, {name: keep[name] for name in sorted(set(kept["backend"]))}


def earlier_serving_steps(
    bundle: Path, cfg: VidurProfileStageConfig, kept: Mapping[str, Any]
) -> pd.DataFrame | None:
    """The calibration replays' steps of the calibrations kept from the bundle being replaced."""
    frames = []
    for name in kept:
        try:
            old = load_bundle(bundle, cfg.model, timings_checked=False).serving_steps(name)
        except ArtifactError:
            return None
        if old is not None:
            frames.append(old)
    return pd.concat(frames, ignore_index=True) if frames else None


def serving_reports(
    meta: Mapping[str, Any], serving_steps: pd.DataFrame, staging: Path
) -> dict[str, Any]:
    """``engine_calibration`` with each calibration's replays under load analysed (what
    besides composition moves a step) and plotted into ``step_residuals.png``."""
    from gpu_simulate_test.calibration import serving_replay

    calibrations = {name: dict(info) for name, info in meta.get("engine_calibration", {}).items()}
    for backend, part in serving_steps.groupby("backend", sort=True):
        info = calibrations.get(str(backend))
        if info is None or not info.get("serving"):
            continue
        report = serving_replay.bundle_report(part, staging / layout.STEP_RESIDUALS_PLOT)
        info["serving"] = {**info["serving"], "residuals": report}
    return calibrations


def write_bundle(
    bundle: Path,
    tables: ProfileTables,
    meta: Mapping[str, Any],
    overwrite: bool,
    engine_steps: pd.DataFrame | None = None,
    serving_steps: pd.DataFrame | None = None,
) -> Path:
    """Write the bundle files into a temporary sibling directory, then rename it into place;
    with calibration replays, their steps and ``step_residuals.png``."""
    bundle.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{bundle.name}.", suffix=".part", dir=bundle.parent))
    old: Path | None = None
    try:
        os.chmod(staging, 0o755)  # mkdtemp makes 0700; a bundle is an ordinary directory
        write_csv(staging / layout.MLP_PROFILE, tables.mlp, MLP_TABLE)
        write_csv(staging / layout.ATTENTION_PROFILE, tables.attention, ATTENTION_TABLE)
        if engine_steps is not None and not engine_steps.empty:
            write_csv(staging / layout.ENGINE_STEPS, engine_steps, ENGINE_STEPS_TABLE)
        if serving_steps is not None and not serving_steps.empty:
            write_csv(staging / layout.SERVING_STEPS, serving_steps, SERVING_STEPS_TABLE)
            meta = {**meta, "engine_calibration": serving_reports(meta, serving_steps, staging)}
        write_json(staging / layout.BUNDLE_META, meta)
        check_bundle_free(bundle, overwrite)
        if bundle.exists():
            old = bundle.with_name(f".{bundle.name}.{os.getpid()}.old")
            os.replace(bundle, old)
        os.replace(staging, bundle)
        if old is not None:
            shutil.rmtree(old)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(staging)
        if old is not None and old.exists() and not bundle.exists():
            os.replace(old, bundle)  # stopped between the two renames: the old bundle back
        raise
    return bundle
