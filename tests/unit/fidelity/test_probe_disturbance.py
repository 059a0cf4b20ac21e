"""The fidelity campaign's capacity probe is judged like its loads: a disturbed burst is run again
(``fidelity.reruns``), and one kept disturbed is said first, since every load's rate rests on it."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import OutputConfig
from gpu_simulate_test.fidelity.manifest import make_manifest
from gpu_simulate_test.fidelity.report import disturbance_lines
from gpu_simulate_test.fidelity.sim_phase import probe_records
from gpu_simulate_test.fidelity.verdict import truth_line
from gpu_simulate_test.orchestrate import probe
from gpu_simulate_test.orchestrate.truth import Attempt, Truth


def kept(root: Path) -> Truth:
    """A probe disturbed on every attempt: the burst and two re-runs, the last one kept."""
    names = ("vllm-capacity", "vllm-capacity-rerun1", "vllm-capacity-rerun2")
    return Truth(tuple(Attempt(root / n, True, ("foreign_cpu: 0.35 cores",)) for n in names))


def test_a_disturbed_burst_is_run_again_and_its_record_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []

    def trusted(cfg: Any, workload_dir: Any, reruns: int = 0, **_: Any) -> Truth:
        asked.append(reruns)
        assert cfg.output.run_id == "vllm-capacity"  # the burst's own run
        return kept(tmp_path)

    monkeypatch.setattr(probe, "trusted_truth", trusted)
    # the burst's workload and its reading stand in for files a real burst writes
    monkeypatch.setattr(probe, "make_workload", lambda cfg: tmp_path / "workload")
    monkeypatch.setattr(probe, "load_workload", lambda d: type("W", (), {"sessions": None}))
    monkeypatch.setattr(probe, "load_run", lambda d, stage: type("R", (), {"requests": []}))
    seen: list[str] = []

    def record(requests: Any, real_dir: str, note: str) -> dict[str, Any]:
        seen.append(real_dir)
        return {"capacity_qps": 41.6, "probe_run": real_dir}

    monkeypatch.setattr(probe, "probe_record", record)
    cfg = dataclasses.replace(PipelineStageConfig(), output=OutputConfig(root=str(tmp_path)))
    out = probe.measure_capacity(cfg, "vllm-capacity", 16, reruns=2)
    assert asked == [2]
    assert seen == [str(tmp_path / "vllm-capacity-rerun2")]  # the capacity is the last attempt's
    assert out["truth"]["disturbed"] is True and out["truth"]["reruns"] == 2
    assert out["probe_requests"] == 16


def test_a_probe_kept_disturbed_is_said_first(tmp_path: Path) -> None:
    truth = kept(tmp_path / "runs" / "real_bench")
    capacity = {"capacity_qps": 41.6, "probe_run": str(truth.real_dir), "truth": truth.to_dict()}
    manifest = make_manifest(
        tmp_path,
        name="camp",
        command="fidelity",
        environment={},
        requests_per_load=0,
        wall_time_s=1.0,
        backends={
            "vllm": {
                "config": {},
                "profiling_root": str(tmp_path),
                "capacity": capacity,
                "loads": [],
            }
        },
    )
    stored = manifest["backends"]["vllm"]["capacity"]["truth"]
    assert stored["real_dir"] == "runs/real_bench/vllm-capacity-rerun2"  # moved with the run
    runs = probe_records(manifest)
    assert [(r["backend"], r["load_fraction"], r["run"], r["disturbed"]) for r in runs] == [
        ("vllm", None, "vllm-capacity-rerun2", True)
    ]
    assert truth_line(runs).startswith("- **Truth: DISTURBED** at vllm capacity probe (")
    table = "\n".join(disturbance_lines(runs))
    assert "| vllm | probe | vllm-capacity-rerun2 | 3 | disturbed, 2 re-run(s)" in table
    given = {**manifest["backends"]["vllm"], "capacity": {"capacity_qps": 60.0}}
    assert probe_records({"backends": {"vllm": given}}) == []  # a capacity given: no probe
