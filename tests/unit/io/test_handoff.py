"""The one real -> simulated hand-off (``io/handoff.py``): relative paths, atomic write, and a
reader whose every refusal names the file and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_simulate_test.capacity import split
from gpu_simulate_test.fidelity import manifest
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.io.handoff import (
    VERSION_FIELD,
    HandoffFormat,
    read_handoff,
    relative,
    require,
    resolve,
    write_handoff,
)

FORMAT = HandoffFormat(
    file="h.json",
    version=3,
    required=("runs",),
    made_by="a test's real half",
    refused={1: "made by the old harness: run the real half again"},
)


def test_paths_are_relative_to_the_run_and_resolve_after_a_move(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert relative(run / "runs" / "a", run) == "runs/a"
    moved = tmp_path / "moved"
    assert resolve("runs/a", moved) == moved / "runs" / "a"
    # outside the run: absolute (read where it was made), or refused when it must travel
    outside = tmp_path / "shared"
    assert relative(outside, run) == str(outside.resolve())
    assert resolve(relative(outside, run), moved) == outside.resolve()
    with pytest.raises(ArtifactError, match="lies outside the run directory"):
        relative(outside, run, inside=True)


def test_round_trip_writes_the_version_and_refuses_another(tmp_path: Path) -> None:
    path = write_handoff(tmp_path, FORMAT, {"runs": ["runs/a"]})
    assert json.loads(path.read_text()) == {"runs": ["runs/a"], VERSION_FIELD: 3}
    assert not list(tmp_path.glob("*.part"))  # written through a temporary sibling
    assert read_handoff(tmp_path, FORMAT)["runs"] == ["runs/a"]
    path.write_text(json.dumps({VERSION_FIELD: 2, "runs": []}))
    with pytest.raises(ArtifactError, match=r"h\.json: manifest_version 2, expected 3$"):
        read_handoff(tmp_path, FORMAT)


def test_refusals_name_the_file_and_the_field(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"no h\.json in .*a test's real half"):
        read_handoff(tmp_path, FORMAT)
    path = tmp_path / FORMAT.file
    path.write_text(json.dumps({VERSION_FIELD: 1, "runs": []}))
    with pytest.raises(ArtifactError, match=r"h\.json: manifest_version 1, expected 3 \(made"):
        read_handoff(tmp_path, FORMAT)
    path.write_text(json.dumps({VERSION_FIELD: 3}))
    with pytest.raises(ArtifactError, match=r"h\.json: has no 'runs' field"):
        read_handoff(tmp_path, FORMAT)
    path.write_text("[1]")
    with pytest.raises(ArtifactError, match="expected a JSON object"):
        read_handoff(tmp_path, FORMAT)
    with pytest.raises(ArtifactError, match=r"h\.json: backends\.x has no 'loads' field"):
        require({"config": {}}, ("loads",), path, "backends.x")


def test_both_stages_hand_off_through_it() -> None:
    """The fidelity and capacity real phases describe their manifests with the one format; their
    file names and versions are those of runs already on disk."""
    assert (manifest.FORMAT.file, manifest.FORMAT.version) == ("fidelity-manifest.json", 2)
    assert (split.FORMAT.file, split.FORMAT.version) == ("capacity-real.json", 2)
