"""The main-job pool benchmark on planted batches: the batch table, the pooled spread and the
error at the calibration's own step level."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from benchmarks.fidelity.bench_main_job_pool import at_least, line_at_one, main, within_chance


def run(level: float, p50: float, p90: float, rr: float = 0.0) -> dict[str, Any]:
    """One stored main job: its step level and client TTFT errors (the truth's repeat ``rr``)."""
    return {
        "step_level": level,
        "ttft": {
            "client_p50": {"error": p50, "real_vs_real": rr, "at_level": p50 / 2},
            "client_p90": {"error": p90, "real_vs_real": rr, "at_level": p90 / 2},
        },
    }


def test_the_line_reads_the_error_at_the_calibrations_speed_apart_from_the_hosts() -> None:
    level = np.array([0.9, 1.0, 1.1, 1.2, 0.95])
    error = 0.02 - 1.0 * (level - 1.0)  # slower servers (level > 1) read lower
    line = line_at_one(level, error)
    assert line["at_one"] == pytest.approx(0.02) and line["slope"] == pytest.approx(-1.0)
    assert line["at_one_se"] == pytest.approx(0.0, abs=1e-9)
    noisy_error = error + np.array([0.01, -0.01, 0.02, -0.02, 0.0])
    noisy = line_at_one(level, noisy_error)
    # the value at level 1 is the intercept of the line in (level - 1): numpy's own covariance
    _, cov = np.polyfit(level - 1.0, noisy_error, 1, cov=True)
    assert noisy["at_one_se"] == pytest.approx(math.sqrt(cov[1, 1]))
    assert math.isnan(line_at_one(np.ones(4), error[:4])["at_one"])  # no spread in level


def test_the_chances_of_a_batch() -> None:
    assert at_least(0.5) == pytest.approx(6 / 32)  # 4 or 5 of 5 heads
    assert at_least(1.0) == pytest.approx(1.0)
    assert within_chance(0.0, 1e-9) == pytest.approx(1.0)
    assert within_chance(0.10, 1e-9) == pytest.approx(0.0)
    # a mean on the bound lands inside half the time; a wide spread lowers a centred batch's
    assert within_chance(0.05, 0.01) == pytest.approx(0.5)
    assert 0.5 < within_chance(0.0, 0.1) < 0.8


def test_batches_pooled_and_one_model_apart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # batch a: at the calibration's speed, within; batch b: slow servers, p90 low
    a = [run(1.0, 0.02, 0.01), run(1.0, -0.02, -0.03), run(1.0, 0.0, 0.02, rr=0.3)]
    b = [run(1.2, -0.05, -0.20), run(1.1, 0.15, -0.12, rr=0.2), run(1.2, -0.03, -0.18)]
    for name, runs in (("a", a), ("b", b)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"results": runs}))
    out = tmp_path / "pool.json"
    main([f"a={tmp_path / 'a.json'}", str(tmp_path / "b.json"), "--only", "a", "--out", str(out)])
    printed = capsys.readouterr().out
    assert "| a | 3 | 1.000 | 3/3, +0.0% | 3/3, +0.0% | – (3 runs) |" in printed  # not a five
    # b's p50 +15% is within its repeat's 20%; its p90 all outside 10% (one repeat of 20%)
    assert "| b | 3 | 1.167 | 3/3, +2.3% | 1/3, -16.7% | – (3 runs) |" in printed
    five = [*a, run(1.0, 0.01, 0.0), run(1.0, 0.0, 0.12)]  # one p90 outside: 4 of 5 within
    (tmp_path / "five.json").write_text(json.dumps({"results": five}))
    main([str(tmp_path / "five.json")])
    assert "| five | 5 | 1.000 | 5/5, +0.2% | 4/5, +2.4% | yes |" in capsys.readouterr().out
    # a run without the figure is not counted among those judged
    partial = [*a, {"step_level": 1.0, "ttft": {"client_p50": {"error": 0.0}}}]
    (tmp_path / "partial.json").write_text(json.dumps({"results": partial}))
    main([str(tmp_path / "partial.json")])
    assert "client TTFT p90: within max(10%, real vs real) in 3 of 3 runs" in (
        capsys.readouterr().out
    )
    doc = json.loads(out.read_text())
    every, only_a = doc["pooled"]["every batch"], doc["pooled"]["a"]
    assert every["runs"] == 6 and only_a["runs"] == 3
    p90 = every["client_p90"]
    assert p90["mean"] == pytest.approx(-0.5 / 6) and p90["within"] == 4
    # like with like: strictly within 10%, the simulation 3 (a's), the truth's repeat 4 of 6
    assert (p90["strictly_within"], p90["repeat_within"], p90["repeats"]) == (3, 4, 6)
    assert "within max(10%, real vs real) in 4 of 6 runs" in printed
    assert p90["at_level_mean"] == pytest.approx(p90["mean"] / 2)
    # the slow servers carry the low p90: at level 1 it reads near zero, the slope steep
    assert abs(p90["line"]["at_one"]) < 0.03 and p90["line"]["slope"] < -0.8
    assert only_a["client_p90"]["batch_within_chance"] > 0.99


def test_a_file_that_is_not_a_batch_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": []}))
    with pytest.raises(SystemExit, match=r"bad\.json: not a bench_fresh_profiles --out file"):
        main([str(bad)])
