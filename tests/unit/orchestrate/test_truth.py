"""The truth re-run while disturbed: each re-run's id, and where it lands (an orchestrator's own
directory when it gives one, so that ``<root>/real_bench/`` holds its main runs only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.io import layout
from gpu_simulate_test.orchestrate import truth


@pytest.fixture
def cfg(compose_stage, tmp_path: Path) -> PipelineStageConfig:
    where = [f"output.root={tmp_path / 'tmp'}", "progress=false", "output.run_id=main"]
    return to_typed(compose_stage("pipeline", where), PipelineStageConfig)


def _replay(monkeypatch, verdicts: list[bool]) -> list[tuple[str, str]]:
    """Fake only the real bench itself (a run directory per call; its verdict from
    ``verdicts``): each call's (output root, run id)."""
    calls: list[tuple[str, str]] = []
    answers = iter(verdicts)

    def run_truth(cfg: PipelineStageConfig, _w: Any, _s: Any, run_id: str, _n: str) -> Path:
        calls.append((cfg.output.root, run_id))
        return layout.run_dir(cfg.output.root, "real_bench", run_id)

    def verdict_of(_d: Path) -> tuple[bool, tuple[str, ...]]:
        disturbed = next(answers)
        return disturbed, ("late_sends: 3 late sends",) if disturbed else ()

    monkeypatch.setattr(truth, "run_truth", run_truth)
    monkeypatch.setattr(truth, "verdict_of", verdict_of)
    monkeypatch.setattr(truth, "wait_for_quiet", lambda _s: (True, 0.0))
    return calls


def test_reruns_land_under_the_orchestrators_directory(cfg, tmp_path, monkeypatch) -> None:
    calls = _replay(monkeypatch, [True, True, False])
    within = tmp_path / "tmp" / "pipeline" / "main" / "runs"
    got = truth.trusted_truth(cfg, "wl", run_id="main", reruns=2, rerun_root=within)
    root = str(tmp_path / "tmp")
    assert calls == [(root, "main"), (str(within), "main-rerun1"), (str(within), "main-rerun2")]
    assert got.real_dir == within / "real_bench" / "main-rerun2" and not got.disturbed
    assert got.reruns == 2


def test_without_a_directory_reruns_stay_beside_the_run(cfg, tmp_path, monkeypatch) -> None:
    calls = _replay(monkeypatch, [True, True])
    got = truth.trusted_truth(cfg, "wl", run_id="main", reruns=1)
    root = str(tmp_path / "tmp")
    assert calls == [(root, "main"), (root, "main-rerun1")]
    assert got.disturbed  # every attempt disturbed: kept and marked
