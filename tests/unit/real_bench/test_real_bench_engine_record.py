"""What a real run records of its engine is never dropped: a step log that stayed empty while the
engine served requests fails the run naming the file, unreadable step lines are counted and said,
and a backend that cannot describe itself leaves ``describe_error`` in ``run_meta.json``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest

from gpu_simulate_test.config.schema import WorkloadStageConfig
from gpu_simulate_test.core.engines.vllm import VllmBackend
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, read_csv, read_json
from gpu_simulate_test.io.schemas import REQUEST_METRICS
from gpu_simulate_test.real_bench import stage
from gpu_simulate_test.real_bench.engine_record import check_step_log
from tests.unit.core.engines.test_real_bench_harness import (
    FakeBackend,
    _bench_cfg,
    _output,
    _tiny_model,
)
from tests.unit.core.engines.test_vllm_backend import _fixture_lines, changed_format_lines


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    from gpu_simulate_test.workload.stage import run as build

    cfg = WorkloadStageConfig(model=_tiny_model(), output=_output(tmp_path, "w"), progress=False)
    cfg = replace(cfg, workload=replace(cfg.workload, num_requests=6, qps=10.0))
    return build(cfg, {"workload": "tiny"})


class LoggedServer(FakeBackend):
    """Serves every request like :class:`FakeBackend`; its server log is ``log_lines`` (real
    vLLM output), read and written up as the vLLM backend does."""

    log_lines: ClassVar[list[str]] = []

    def write_artifacts(self, run_dir: Path, origin: float, since: float) -> dict[str, Any]:
        server = VllmBackend(self.cfg)
        for line in self.log_lines:
            server.steps.feed(line, since)
        return server.write_artifacts(run_dir, origin, since)


def _run(compose_stage: Any, tmp_path: Path, workload: Path, backend: type) -> Path:
    cfg = _bench_cfg(compose_stage, tmp_path, workload, "backend=vllm")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stage, "get_backend", lambda name: backend)
        return stage.run(cfg, {"x": 1})


def test_a_run_whose_step_log_stayed_empty_fails_naming_it(
    compose_stage: Any, tmp_path: Path, workload: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the real server's start-up and request lines, and its step lines in a changed format
    lines = [line for line in _fixture_lines() if "Iteration(" not in line]
    unseen = type("Unseen", (LoggedServer,), {"log_lines": [*lines, *changed_format_lines()]})
    with pytest.raises(ArtifactError) as err:
        _run(compose_stage, tmp_path, workload, unseen)
    message = str(err.value)
    assert "engine_step_log.csv: no engine step was read" in message
    assert "served 6 request(s)" in message and "2 line(s) looked like steps" in message
    assert "prefill requests" in message  # the first unreadable line is quoted
    run = tmp_path / "tmp" / "real_bench" / "b"
    meta = read_json(run / layout.RUN_META)
    assert meta["status"] == "failed" and "no engine step was read" in meta["error"]
    assert meta["engine_log"]["engine_steps"] == 0
    assert meta["engine_log"]["unreadable_step_lines"] == 2
    assert len(read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)) == 6  # still written
    assert "2 step line(s) of the server's log could not be read" in capsys.readouterr().out


def test_a_run_whose_steps_were_read_completes(
    compose_stage: Any, tmp_path: Path, workload: Path
) -> None:
    seen = type("Seen", (LoggedServer,), {"log_lines": _fixture_lines()})
    meta = read_json(_run(compose_stage, tmp_path, workload, seen) / layout.RUN_META)
    assert meta["status"] == "complete" and meta["engine_log"]["engine_steps"] == 520
    assert meta["engine_log"]["unreadable_step_lines"] == 0


def test_only_a_step_log_that_was_read_and_stayed_empty_fails(tmp_path: Path) -> None:
    check_step_log(tmp_path, {}, 6)  # an in-process engine keeps no step log
    check_step_log(tmp_path, {"engine_steps": None}, 6)  # a server without its log file
    check_step_log(tmp_path, {"engine_steps": 0}, 0)  # nothing served, nothing to log
    with pytest.raises(ArtifactError, match=r"engine_step_log\.csv: no engine step was read"):
        check_step_log(tmp_path, {"engine_steps": 0, "unreadable_step_lines": 0}, 1)


class Undescribed(FakeBackend):
    def describe(self) -> dict[str, Any]:
        raise RuntimeError("no /version answer")


def test_a_backend_that_cannot_describe_itself_is_recorded_not_dropped(
    compose_stage: Any, tmp_path: Path, workload: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _bench_cfg(compose_stage, tmp_path, workload)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(stage, "get_backend", lambda name: Undescribed)
        path = stage.run(cfg, {"x": 1})
    meta = read_json(path / layout.RUN_META)
    assert meta["status"] == "complete"
    assert meta["backend"]["describe_error"] == "RuntimeError: no /version answer"
    assert "could not describe itself" in capsys.readouterr().out
