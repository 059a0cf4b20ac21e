"""A sweep's x read from each run's comparison.json: a field that is not a number is named with
its file, not read as Python's ``could not convert string to float``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_simulate_test.compare.sweep import shared_x
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.vidur import VidurConfig
from gpu_simulate_test.io.artifacts import ArtifactError


def test_each_run_sits_at_its_own_x() -> None:
    runs: list[tuple[Path, dict[str, Any], None]] = [
        (Path("a"), {"offered_qps": 2.0}, None),
        (Path("b"), {"offered_qps": 4}, None),
    ]
    assert shared_x(runs, "offered_qps") is None
    runs.append((Path("c"), {"offered_qps": 4.0}, None))
    assert shared_x(runs, "offered_qps") == (Path("b"), Path("c"), 4.0)
    caps: list[tuple[Path, dict[str, Any], None]] = [
        (Path(n), {"setup": {"sim": {"scheduler": {"batch_size_cap": 8}}}}, None) for n in "ab"
    ]
    assert shared_x(caps, "batch_size_cap") == (Path("a"), Path("b"), 8.0)


@pytest.mark.parametrize(
    ("axis", "comparison", "name"),
    [("offered_qps", {"offered_qps": "fast"}, "offered_qps"),
     ("batch_size_cap", {"setup": {"sim": {"scheduler": {"batch_size_cap": [8]}}}},
      "setup.sim.scheduler.batch_size_cap")],
)  # fmt: skip
def test_an_x_that_is_not_a_number_names_file_and_field(
    axis: str, comparison: dict, name: str
) -> None:
    runs = [(Path("run-a"), {"offered_qps": 1.0, "setup": {}}, None), (Path("run-b"), comparison,
            None)]  # fmt: skip
    with pytest.raises(ArtifactError) as err:
        shared_x(runs, axis)
    text = str(err.value)
    assert text.startswith(str(Path("run-b") / "comparison.json")) and f"field {name!r}" in text


@pytest.mark.parametrize("seed", [-1, 2**32])
def test_a_seed_vidur_cannot_take_is_refused_before_any_run(seed: int) -> None:
    with pytest.raises(ConfigError, match=rf"vidur.seed={seed} must be a whole number from 0"):
        VidurConfig(seed=seed)
    VidurConfig(seed=2**32 - 1)
