"""The calibration record: one backend's rows and meta.json entry read as one typed object, each
bad field refused with the file and the key; what a simulation says of it, read for compare."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_simulate_test.calibration.frontend_queue import FrontEndQueue
from gpu_simulate_test.calibration.overhead import FrontEnd
from gpu_simulate_test.calibration.record import (
    CALIBRATION_VERSION,
    CalibrationRecord,
    SimulatedCalibration,
)
from gpu_simulate_test.core.profiling.bundle import ENGINE_STEPS_TABLE, load_bundle
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, read_json, write_csv, write_json
from tests.unit.calibration.test_engine_overhead import steps
from tests.vidur_bundle_factory import QWEN3_TINY, write_synthetic_bundle

FRONTEND = {
    "input_ms": 3.87,
    "input_per_running_ms": 1.12,
    "output_ms": 2.3,
    "measured_input_ms": {"0": 3.5, "4": 7.4},
    "queue": {"request_ms": 0.3, "step_ms": 0.5, "token_ms": 0.05},
}


def calibrated(tmp_path: Path, **info: Any) -> CalibrationRecord:
    """hf_cb's record in a synthetic bundle whose meta.json entry is ``info``."""
    path = tmp_path / "cpu" / QWEN3_TINY.name
    if not path.is_dir():
        write_synthetic_bundle(tmp_path, QWEN3_TINY, points=6)
        write_csv(path / layout.ENGINE_STEPS, steps(), ENGINE_STEPS_TABLE)
    meta = read_json(path / layout.BUNDLE_META)
    write_json(path / layout.BUNDLE_META, {**meta, "engine_calibration": {"hf_cb": info}})
    return CalibrationRecord.load(load_bundle(path), "hf_cb")


def test_the_record_holds_the_rows_and_every_typed_field(tmp_path: Path) -> None:
    probe = {"ms": 3.0, "mbytes": 77.791}
    record = calibrated(
        tmp_path,
        version=CALIBRATION_VERSION,
        settings={"decode_tokens": 16},
        dtype="float32",
        step_jitter={"percentiles": [0, 50, 100], "ratios": [1.0, 1.1, 1.6]},
        frontend=FRONTEND,
        host_probe=probe,
        step_times_from="engine step record",
    )
    assert record.version == CALIBRATION_VERSION and record.backend == "hf_cb"
    assert len(record.steps) == 7 and set(record.steps["backend"]) == {"hf_cb"}
    assert record.serving_steps is None and record.serving is None  # no replays under load
    assert record.require_step_jitter().ratios == (1.0, 1.1, 1.6)
    assert record.frontend == FrontEnd(3.87, 2.3, 1.12, running_max=4.0)
    assert record.frontend_queue == FrontEndQueue(0.3, 0.5, 0.05)
    assert record.host_probe == probe and record.settings == {"decode_tokens": 16}
    assert record.engine == {} and record.step_times_from == "engine step record"


def test_an_old_calibration_reads_with_what_it_has(tmp_path: Path) -> None:
    """No version, no spread, no front end: read; the spread is refused only when asked for."""
    record = calibrated(tmp_path)
    assert record.version is None and record.frontend is None and record.frontend_queue is None
    with pytest.raises(ArtifactError, match=r"meta.json: engine_calibration\.hf_cb\.step_jitter"):
        record.require_step_jitter()


@pytest.mark.parametrize(
    ("info", "message"),
    [
        ({"version": "9"}, r"meta.json: engine_calibration\.hf_cb\.version: expected an integer"),
        ({"version": CALIBRATION_VERSION + 1}, r"hf_cb\.version: \d+, made by a later version"),
        ({"frontend": {"input_ms": 1}}, r"hf_cb\.frontend\.output_ms: expected a number"),
        (
            {"frontend": {**FRONTEND, "queue": {"request_ms": -1}}},
            r"hf_cb\.frontend\.queue\.request_ms: expected a finite value >= 0",
        ),
        ({"step_jitter": {"ratios": [1]}}, r"hf_cb\.step_jitter: expected"),
        ({"settings": [1]}, r"hf_cb\.settings: expected a mapping, got list"),
        ({"dtype": 32}, r"hf_cb\.dtype: expected a string, got int"),
    ],
    ids=["version-type", "later-version", "frontend", "queue", "jitter", "settings", "dtype"],
)
def test_a_bad_field_is_refused_by_file_and_key(
    tmp_path: Path, info: dict[str, Any], message: str
) -> None:
    with pytest.raises(ArtifactError, match=message):
        calibrated(tmp_path, **info)


def test_no_calibration_for_the_backend_is_named(tmp_path: Path) -> None:
    calibrated(tmp_path)
    bundle = load_bundle(tmp_path / "cpu" / QWEN3_TINY.name)
    with pytest.raises(ArtifactError, match="no engine calibration for backend 'vllm'"):
        CalibrationRecord.load(bundle, "vllm")


def test_what_a_simulation_says_of_its_calibration() -> None:
    used = SimulatedCalibration.from_run_meta(
        {
            "engine_overhead": {"ops_scale": 1.0},
            "frontend": {"input_ms": 3.0, "output_ms": 1.5},
            "mean_frontend_input_ms": 4.25,
            "mean_frontend_output_ms": None,
            "calibration_host_probe": {"ms": 3.0},
        }
    )
    assert used.frontend_ttft_ms == pytest.approx(5.75)  # the constant output without a queue
    assert used.host_probe == {"ms": 3.0} and used.engine_overhead == {"ops_scale": 1.0}
    queued = SimulatedCalibration.from_run_meta(
        {
            "frontend": {"output_ms": 1.5},
            "mean_frontend_input_ms": 4.0,
            "mean_frontend_output_ms": 2,
        }
    )
    assert queued.frontend_ttft_ms == pytest.approx(6.0)
    bare = SimulatedCalibration.from_run_meta({"engine_overhead": None, "frontend": None})
    assert (
        bare.frontend_ttft_ms is None and bare.engine_overhead is None and bare.host_probe is None
    )
