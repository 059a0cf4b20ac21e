"""The calibration's validation replay: its workload, how its errors are read, and what a miss
does (redo once, then a quality warning the orchestrators refuse)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_json, write_json
from gpu_simulate_test.orchestrate import validation
from gpu_simulate_test.orchestrate.profiling import (
    DisturbedProfileError,
    check_calibration,
    check_profile_quality,
)


@pytest.fixture
def cfg(compose_stage, tmp_path: Path) -> PipelineStageConfig:
    where = [f"output.root={tmp_path / 'tmp'}", f"profiling_root={tmp_path / 'profiles'}"]
    composed = compose_stage("pipeline", [*where, "progress=false", "output.run_id=main"])
    return to_typed(composed, PipelineStageConfig)


def _clocks(engine: float | None, client: float) -> dict[str, Any]:
    rows = [
        {"metric": m, "stat": s, "error_vs_engine": engine, "error_vs_client": client}
        for m in ("ttft", "tpot", "e2e", "itl")
        for s in ("p50", "p90")
    ]
    metrics = {m: {"errors": {"p50": {"signed": client}}} for m in ("ttft", "tpot", "e2e")}
    return {"clocks": rows, "metrics": metrics}


def test_both_clocks_are_read_the_engine_where_the_truth_has_it() -> None:
    both = validation.p50_errors(_clocks(0.05, -0.3))
    assert both["engine"] == {"ttft": 0.05, "tpot": 0.05, "e2e": 0.05}
    assert both["client"]["e2e"] == pytest.approx(-0.3)
    assert list(validation.p50_errors(_clocks(None, -0.3))) == ["client"]
    comparison = _clocks(0.05, -0.3)
    comparison["clocks"][0].update(front_end_s=0.0026, sim_front_end_s=0.0035)
    assert validation.front_end_ms(comparison) == {"real": 2.6, "simulated": 3.5}
    assert validation.front_end_ms(_clocks(0.05, -0.3)) is None


def test_the_validation_workload_has_its_own_seed_and_a_bounded_size(cfg) -> None:
    fields = validation.validation_workload(cfg)
    assert fields["seed"] not in (cfg.workload.seed, 104729)
    assert fields["arrival"].process == "poisson"
    assert fields["num_requests"] == round(cfg.workload.qps * validation.DURATION_S)
    busy = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, qps=1000.0))
    assert validation.validation_workload(busy)["num_requests"] == validation.MAX_REQUESTS
    same = dataclasses.replace(cfg, workload=dataclasses.replace(cfg.workload, seed=104730))
    assert validation.validation_workload(same)["seed"] != 104730


def _check(attempt: int, worst: float, disturbed: bool = False) -> dict[str, Any]:
    return {
        "attempt": attempt,
        "seed": 104730,
        "num_requests": 16,
        "qps": 2.0,
        "p50_error": {
            "engine": {"ttft": worst, "tpot": 0.01, "e2e": -0.02},
            "client": {"ttft": 0.02, "tpot": 0.01, "e2e": -0.02},
        },
        "largest_abs_error": abs(worst),
        "limit": validation.LIMIT,
        "real_disturbed": disturbed,
        "passed": None if disturbed else abs(worst) <= validation.LIMIT,
    }


class _Stages:
    """Records the profile runs a check asks for; each writes a bundle's meta.json."""

    def __init__(self, bundle: Path) -> None:
        self.bundle = bundle
        self.runs: list[tuple[str, str]] = []
        self.roots: list[str] = []
        self.facts: dict[str, Any] = {}
        self.record_in = SimpleNamespace(path=bundle.parent / "pipeline" / "main")
        """The orchestrator's run: the checks' own stage runs go in its directory."""
        self.within: list[Path | None] = []

    def run(self, name: str, _call: Any, stage_cfg: Any) -> Path:
        self.runs.append((name, stage_cfg.output.run_id))
        self.roots.append(stage_cfg.output.root)
        write_json(self.bundle / layout.BUNDLE_META, {"quality_warnings": []})
        return self.bundle

    def record(self, **facts: Any) -> None:
        self.facts.update(facts)


def _run_check(cfg, tmp_path: Path, monkeypatch, worsts: list[float]) -> tuple[Path, _Stages]:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    write_json(bundle / layout.BUNDLE_META, {"quality_warnings": []})
    answers = iter(worsts)
    stages = _Stages(bundle)

    def validate(_c: Any, _s: Any, attempt: int, within: Path | None = None) -> dict[str, Any]:
        stages.within.append(within)
        return _check(attempt, next(answers))

    monkeypatch.setattr(validation, "validate", validate)
    decided = type("Decided", (), {"scheduler": None, "needs": None})()
    monkeypatch.setattr(
        "gpu_simulate_test.orchestrate.profiling.profile_config",
        lambda c, *_a: type("P", (), {"output": c.output})(),
    )
    return check_calibration(cfg, decided, "wl", stages, bundle), stages  # type: ignore[arg-type]


def test_a_passing_check_is_recorded_and_nothing_is_redone(cfg, tmp_path, monkeypatch) -> None:
    bundle, stages = _run_check(cfg, tmp_path, monkeypatch, [0.08])
    meta = read_json(bundle / layout.BUNDLE_META)
    assert stages.runs == [] and meta["validation"]["passed"] is True
    assert meta["validation"]["checks"][0]["p50_error"]["engine"]["ttft"] == 0.08
    check_profile_quality(cfg, bundle)  # no warning


def test_a_miss_redoes_the_calibration_once(cfg, tmp_path, monkeypatch) -> None:
    bundle, stages = _run_check(cfg, tmp_path, monkeypatch, [4.44, 0.05])
    assert stages.runs == [("vidur_profile", "main-recalibration")]
    # the validation replays and the redone profile run go in the orchestrator's directory
    runs = tmp_path / "pipeline" / "main" / "runs"
    assert stages.within == [runs, runs] and stages.roots == [str(runs)]
    meta = read_json(bundle / layout.BUNDLE_META)
    assert [c["passed"] for c in meta["validation"]["checks"]] == [False, True]
    assert meta["quality_warnings"] == []
    check_profile_quality(cfg, bundle)


def test_two_misses_are_a_quality_warning_the_pipeline_refuses(cfg, tmp_path, monkeypatch) -> None:
    bundle, stages = _run_check(cfg, tmp_path, monkeypatch, [4.44, 0.6])
    meta = read_json(bundle / layout.BUNDLE_META)
    assert meta["validation"]["passed"] is False and len(stages.runs) == 1
    assert any(w.startswith("validation:") for w in meta["quality_warnings"])
    with pytest.raises(DisturbedProfileError, match="quality_warnings"):
        check_profile_quality(cfg, bundle)
    check_profile_quality(dataclasses.replace(cfg, accept_profile_warnings=True), bundle)


def test_describe_says_what_ran_and_the_verdict() -> None:
    line = validation.describe(_check(1, 0.3))
    assert "engine TTFT +30.0%" in line and "client TTFT +2.0%" in line
    assert "FAILED" in line and "seed 104730" in line
    assert "not judged" in validation.describe(_check(2, 0.9, disturbed=True))
