"""The capacity search split in two: the real search's answer survives the manifest, and the
split's knobs refuse what cannot run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from gpu_simulate_test.capacity.search import Answer, Point
from gpu_simulate_test.capacity.split import answer_from, answer_record
from gpu_simulate_test.config.capacity import CapacityOptions
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
