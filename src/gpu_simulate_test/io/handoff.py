"""The hand-off between a run's real half and its simulated half.

A stage split in two (``fidelity.phase=real|sim``, ``capacity.phase=real|sim``) runs its real half
where the engine is (the GPU machine, which has no Vidur) and its simulated half anywhere. The
real half leaves a run directory that travels (tarred, copied, moved) with one JSON manifest in
it, written here:

- **written atomically and last**: after every artifact it names (a real half stopped part-way
  leaves the manifest of what it finished, or none, never half of one); :func:`write_handoff`;
- **paths relative to the run directory** (:func:`relative`), so that the directory can be moved;
  a path outside it stays absolute where the stage allows that (a shared bundle read where it
  was made) and is refused where it does not (:func:`relative` with ``inside=True``);
- **read with checks** (:func:`read_handoff`): the file exists, is JSON, of a version this code
  reads, with every field the stage requires; each failure is one :class:`ArtifactError` naming
  the file and the field. Nested fields are checked with :func:`require`.

Each stage keeps what it records (its own fields, in its ``contract`` or split module) and
describes its manifest with one :class:`HandoffFormat`. A manifest of another version is refused,
with what to do about it where ``refused`` names that version.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_simulate_test.io.artifacts import ArtifactError, write_json

VERSION_FIELD = "manifest_version"
"""The field every hand-off manifest keeps its version in."""


@dataclass(frozen=True)
class HandoffFormat:
    """One stage's hand-off manifest: its file, versions and required top-level fields."""

    file: str
    """The manifest's file name in the run directory."""
    version: int
    """The version this code writes."""
    required: tuple[str, ...]
    """Top-level fields a manifest must have (besides :data:`VERSION_FIELD`)."""
    made_by: str
    """The run that writes it, for an error on a directory without one
    (``a capacity.phase=real run (tmp/capacity/<run_id>)``)."""
    refused: Mapping[int, str] = field(default_factory=dict)
    """Versions that cannot be read, each with what to do instead."""


def relative(path: str | Path, root: str | Path, *, inside: bool = False) -> str:
    """``path`` relative to the run directory ``root`` (POSIX separators); a path outside it is
    kept absolute, or, with ``inside``, refused (it would not travel with the directory)."""
    resolved, base = Path(path).resolve(), Path(root).resolve()
    if resolved.is_relative_to(base):
        return resolved.relative_to(base).as_posix()
    if inside:
        raise ArtifactError(f"{path}: lies outside the run directory {root}; it cannot travel")
    return str(resolved)


def resolve(recorded: str, root: str | Path) -> Path:
    """A path a manifest recorded, against the run directory it now lies in (an absolute one is
    itself)."""
    return Path(root) / recorded


def write_handoff(root: str | Path, fmt: HandoffFormat, manifest: Mapping[str, Any]) -> Path:
    """Write ``manifest`` (its :data:`VERSION_FIELD` set to ``fmt.version``) as ``fmt.file`` under
    ``root``, atomically. Call it after every artifact it names is written."""
    return write_json(Path(root) / fmt.file, {**dict(manifest), VERSION_FIELD: fmt.version})


def read_handoff(root: str | Path, fmt: HandoffFormat) -> dict[str, Any]:
    """The manifest under ``root``, checked: present, JSON, of ``fmt.version``, with every
    field of ``fmt.required``. ArtifactError names the file and the field."""
    path = Path(root) / fmt.file
    if not path.is_file():
        raise ArtifactError(f"no {fmt.file} in {root}: expected the run directory of {fmt.made_by}")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{path}: expected a JSON object, got {type(manifest).__name__}")
    version = manifest.get(VERSION_FIELD)
    if version != fmt.version:
        why = fmt.refused.get(version) if isinstance(version, int) else None
        raise ArtifactError(
            f"{path}: {VERSION_FIELD} {version!r}, expected {fmt.version}"
            + (f" ({why})" if why else "")
        )
    require(manifest, fmt.required, path)
    return manifest


def require(record: Any, keys: Sequence[str], path: Path, where: str = "") -> None:
    """Refuse ``record`` (the manifest's part at ``where``, ``backends.hf_cb``; empty: the top)
    unless it is an object with every one of ``keys``; the error names the file and the field."""
    at = f"{where} " if where else ""
    if not isinstance(record, Mapping):
        raise ArtifactError(f"{path}: {at or 'the manifest '}is not a JSON object")
    for key in keys:
        if key not in record:
            raise ArtifactError(f"{path}: {at}has no {key!r} field")
