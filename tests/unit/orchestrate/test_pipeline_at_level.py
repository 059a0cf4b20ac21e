"""The pipeline's simulation at the real run's own step level: its level recorded beside the
answer, and a failure there said and recorded without costing the answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.vidur import VidurSchedulerConfig
from gpu_simulate_test.io.runs import start_run
from gpu_simulate_test.orchestrate.steps import Stages
from gpu_simulate_test.pipeline import stage


def _at_level(tmp_path: Path, compose_stage: Any) -> tuple[Path | None, dict[str, Any]]:
    cfg = to_typed(compose_stage("pipeline"), PipelineStageConfig)
    with start_run(tmp_path, "pipeline", "p", {}) as p:
        got = stage.at_level(
            cfg, VidurSchedulerConfig(), tmp_path / "w", tmp_path / "r", p, Stages(record_in=p)
        )
    return got, json.loads((tmp_path / "pipeline" / "p" / "run_meta.json").read_text())


def test_the_level_is_recorded_and_its_run_handed_on(
    tmp_path: Path, compose_stage: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: dict[str, Any] = {}

    def simulated(cfg: Any, scheduler: Any, workload: Any, real: Any, root: Path, stages: Any):
        seen["root"] = root
        return {"ratio": 1.054, "steps": 812, "per_run": [1.054]}, root / "x-at-level"

    monkeypatch.setattr(stage, "simulate_at_level", simulated)
    got, meta = _at_level(tmp_path, compose_stage)
    runs = tmp_path / "pipeline" / "p" / stage.RUNS_DIR
    assert seen["root"] == runs  # in the pipeline's own runs, beside the seeds and the repeat
    assert got == runs / "x-at-level"
    assert meta["at_real_step_level"] == {"ratio": 1.054, "steps": 812, "per_run": [1.054]}


def test_a_failed_level_is_said_and_the_answer_goes_on(
    tmp_path: Path,
    compose_stage: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def failed(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("engine_schedule.csv: start_time_s is not a number")

    monkeypatch.setattr(stage, "simulate_at_level", failed)
    got, meta = _at_level(tmp_path, compose_stage)
    assert got is None and meta["status"] == "complete"
    assert meta["at_real_step_level"] == {
        "error": "ValueError: engine_schedule.csv: start_time_s is not a number"
    }
    assert "the simulation at the real run's step level failed" in capsys.readouterr().out


@pytest.mark.parametrize(("device", "front_end"), [("cpu", True), ("cuda", False)])
def test_the_level_scales_the_front_end_where_the_engine_shares_the_hosts_cpu(
    tmp_path: Path,
    compose_stage: Any,
    monkeypatch: pytest.MonkeyPatch,
    device: str,
    front_end: bool,
) -> None:
    """On the host's CPU the API server shares the engine's cores: the level's simulation takes
    its front end that much slower too, and says so; on a GPU only the steps."""
    import dataclasses

    from gpu_simulate_test.orchestrate import step_level

    def level(*args: Any) -> dict[str, Any]:
        return {"ratio": 1.25, "steps": 400, "per_run": [1.25]}

    monkeypatch.setattr(step_level, "real_step_level", level)
    cfg = to_typed(compose_stage("pipeline"), PipelineStageConfig)
    cfg = dataclasses.replace(cfg, hardware=dataclasses.replace(cfg.hardware, device=device))
    got = step_level.at_level_config(cfg, VidurSchedulerConfig(), tmp_path / "w", tmp_path / "r")
    assert got is not None
    recorded, at = got
    assert recorded == {"ratio": 1.25, "steps": 400, "per_run": [1.25], "front_end": front_end}
    assert at.vidur.step_time_scale == 1.25
    assert at.vidur.frontend_time_scale == (1.25 if front_end else 1.0)
