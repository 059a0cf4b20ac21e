"""The capacity search split in two: the real search's answer survives the manifest, and the
split's knobs refuse what cannot run."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpu_simulate_test.capacity.search import Answer, Point
from gpu_simulate_test.capacity.split import answer_from, answer_record
from gpu_simulate_test.config.capacity import CapacityOptions, CapacityStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.io.artifacts import ArtifactError


def test_the_real_search_survives_the_manifest(tmp_path: Path) -> None:
    met = Point(8.0, "grid", {"ttft_p90": 40.0, "tpot_p90": 20.0}, True, (), 12.5, 7.9)
    missed = Point(
        16.0, "grid", {"ttft_p90": 140.0, "tpot_p90": math.nan}, False, ("ttft_p90 140.0 > 100",)
    )
    answer = Answer(8.0, (8.0, 16.0), (met, missed), "a note")
    stored = tmp_path / "m.json"
    stored.write_text(json.dumps(answer_record(answer)))  # NaN goes in as null
    back = answer_from(json.loads(stored.read_text()), stored)
    assert back.qps == 8.0 and back.bracket == (8.0, 16.0) and back.note == "a note"
    assert back.points[0] == met
    assert back.points[1].violated == ("ttft_p90 140.0 > 100",) and not back.points[1].meets
    assert math.isnan(back.points[1].latency_ms["tpot_p90"])
    none_met = answer_from(answer_record(Answer(None, (1.0, 2.0))), stored)
    assert none_met.qps is None and none_met.points == ()
    with pytest.raises(ArtifactError, match=r"m\.json: field 'measured'"):
        answer_from({"qps": 1.0}, stored)


def test_a_real_phase_of_the_grid_search_is_refused_saying_what_to_do(tmp_path: Path) -> None:
    """A version-1 manifest (the real search replayed the simulated grid, a fixed count a rate)
    is refused before anything is simulated, naming the file and what to run instead."""
    from gpu_simulate_test.capacity.split import MANIFEST_FILE, read_real

    (tmp_path / "run_meta.json").write_text(
        json.dumps({"stage": "capacity", "status": "complete", "phase": "real"})
    )
    (tmp_path / MANIFEST_FILE).write_text(json.dumps({"manifest_version": 1, "grid": {}}))
    cfg = CapacityStageConfig(capacity=CapacityOptions(phase="sim", real_from=str(tmp_path)))
    with pytest.raises(
        ArtifactError,
        match=r"capacity-real\.json: manifest_version 1, expected 2 "
        r"\(its real search replayed the simulated grid.*run the real phase again",
    ):
        read_real(tmp_path, cfg)


def test_the_split_implies_the_real_search_and_needs_its_source() -> None:
    assert CapacityOptions(phase="real").verify == "search"
    assert CapacityOptions(phase="sim", real_from="x").verify == "search"
    assert CapacityOptions().verify == "false"
    with pytest.raises(ConfigError, match="must be one of all, real, sim"):
        CapacityOptions(phase="both")
    with pytest.raises(ConfigError, match=r"needs capacity\.real_from"):
        CapacityOptions(phase="sim")
    with pytest.raises(ConfigError, match="real_from goes with phase=sim only"):
        CapacityOptions(real_from="x")
    with pytest.raises(ConfigError, match="verify=answer needs the simulated answer"):
        CapacityOptions(phase="real", verify="answer")


def test_the_real_phase_profiles_without_simulating(
    compose_stage: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """phase=real never simulates (the GPU machine has no Vidur): a calibration it makes skips
    its validation replay, and its bundle is carried into the run; phase=all validates."""
    from gpu_simulate_test.capacity import split

    def config(*overrides: str) -> CapacityStageConfig:
        composed = compose_stage(
            "capacity", ["backend=hf_cb", f"output.root={tmp_path}", "progress=false", *overrides]
        )
        return to_typed(composed, CapacityStageConfig)

    profiled: list[Any] = []
    monkeypatch.setattr(split, "make_workload", lambda c: tmp_path / "workload")
    monkeypatch.setattr(split, "profile_plan", lambda c, w: SimpleNamespace(misfits=["none"]))
    monkeypatch.setattr(split, "served", lambda base, *a: contextlib.nullcontext(base))
    monkeypatch.setattr(split, "ensure_bundle", lambda c, *a: profiled.append(c))
    monkeypatch.setattr(split, "carry_bundle", lambda c, r: tmp_path / "carried")
    run = SimpleNamespace(path=tmp_path)
    real = config("capacity.phase=real")
    inner, _, _ = split.bundle_and_workload(real, real.pipeline(), run)  # type: ignore[arg-type]
    assert profiled[-1].validate_calibration is False
    assert inner.profiling_root == str(tmp_path / "carried")
    here = config()
    inner, _, _ = split.bundle_and_workload(here, here.pipeline(), run)  # type: ignore[arg-type]
    assert profiled[-1].validate_calibration is True
    assert inner.profiling_root == here.profiling_root  # nothing carried
