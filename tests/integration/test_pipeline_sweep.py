"""Multirun wiring: the joblib and submitit launchers run the jobs, the callback reports them."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
from hydra import compose
from hydra.utils import instantiate
from omegaconf import DictConfig

from gpu_simulate_test.compare.stage import run as compare_run
from gpu_simulate_test.config.compare import CompareOptions, CompareStageConfig
from gpu_simulate_test.config.schema import OutputConfig
from tests.conftest import run_cli
from tests.integration.test_compare_stage import make_run

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("launcher", ["joblib", "submitit_local"])
def test_workload_multirun_through_a_launcher(tmp_path: Path, launcher: str) -> None:
    extra = ["hydra.launcher.n_jobs=2"] if launcher == "joblib" else []
    run_cli("workload", "-m", f"hydra/launcher={launcher}", *extra, "workload.qps=2,4",
            "workload.num_requests=8", "output.run_id=w", "progress=false",
            cwd=tmp_path)  # fmt: skip
    qps = {}
    for job in (0, 1):
        meta = json.loads(
            (tmp_path / "tmp" / "workload" / f"w-{job}" / "run_meta.json").read_text()
        )
        assert meta["status"] == "complete"
        qps[job] = meta["config"]["workload"]["qps"]
    assert sorted(qps.values()) == [2.0, 4.0]


def _compare(root: Path, run_id: str, scale: float, qps: float) -> None:
    real = make_run(root, "real_bench", f"r-{run_id}", workload_id=f"wl-{run_id}", qps=qps)
    sim = make_run(root, "vidur_simulate", f"s-{run_id}", workload_id=f"wl-{run_id}", qps=qps,
                   scale=scale)  # fmt: skip
    cfg = CompareStageConfig(
        real_run_dir=str(real),
        sim_run_dir=str(sim),
        compare=CompareOptions(plots=False),
        output=OutputConfig(root=str(root), run_id=run_id),
        progress=False,
    )
    compare_run(cfg, {"run_id": run_id})


def _pipeline_config(compose_stage, *overrides: str) -> DictConfig:
    """configs/pipeline.yaml with its ``hydra`` node (where the callback is declared)."""
    compose_stage("pipeline")  # initializes Hydra on the project's configs
    return compose(config_name="pipeline", overrides=list(overrides), return_hydra_config=True)


def test_callback_reports_this_multiruns_jobs(tmp_path: Path, compose_stage) -> None:
    root = tmp_path / "tmp"
    cfg = _pipeline_config(
        compose_stage, f"output.root={root}", "output.run_id=q", "progress=false"
    )
    _compare(root, "q-7", 0.5, 8.0)  # a job of an earlier multirun with the same id: left out
    time.sleep(0.01)
    callback = instantiate(cfg.hydra.callbacks.sweep_report)
    callback.on_multirun_start(config=cfg)
    assert callback.started <= datetime.now(UTC)
    for job, (qps, scale) in enumerate(((1.0, 0.9), (2.0, 0.8))):
        _compare(root, f"q-{job}", scale, qps)
    callback.on_multirun_end(config=cfg)

    out = root / "compare" / "q-sweep"
    meta = json.loads((out / "run_meta.json").read_text())
    assert meta["sweep_dirs"] == [str(root / "compare" / "q-0"), str(root / "compare" / "q-1")]
    table = pd.read_csv(out / "sweep.csv")
    ttft_p90 = table[(table["metric"] == "ttft") & (table["stat"] == "p90")]
    assert ttft_p90["load"].tolist() == pytest.approx([1.0, 2.0])
    assert ttft_p90["signed_rel_error"].tolist() == pytest.approx([-0.1, -0.2])
    assert (out / "sweep_latency_vs_load.png").is_file()

    # a later report over the glob q-* skips the sweep report q-sweep it also matches
    proc = run_cli("compare", f"sweep_dirs=[{root}/compare/q-*]", "output.run_id=again",
                   "compare.sweep_x=run", cwd=tmp_path)  # fmt: skip
    assert "sweep of 3 compare runs" in proc.stdout


def test_callback_needs_a_run_id_and_two_jobs(tmp_path: Path, compose_stage, capsys) -> None:
    root = tmp_path / "tmp"
    cfg = _pipeline_config(compose_stage, f"output.root={root}", "output.run_id=one")
    callback = instantiate(cfg.hydra.callbacks.sweep_report)
    callback.on_multirun_start(config=cfg)
    _compare(root, "one-0", 0.9, 1.0)
    callback.on_multirun_end(config=cfg)
    assert not (root / "compare" / "one-sweep").exists()
    assert "no sweep report" in capsys.readouterr().out


def test_callback_refuses_an_existing_report_before_the_jobs(
    tmp_path: Path, compose_stage, capsys
) -> None:
    """Hydra turns a callback's exception into a warning and exit 0: the callback exits itself."""
    root = tmp_path / "tmp"
    (root / "compare" / "pw-sweep").mkdir(parents=True)
    cfg = _pipeline_config(compose_stage, f"output.root={root}", "output.run_id=pw")
    callback = instantiate(cfg.hydra.callbacks.sweep_report)
    with pytest.raises(SystemExit) as caught:
        callback.on_multirun_start(config=cfg)
    assert caught.value.code == 2
    printed = capsys.readouterr().out.replace("\n", "")  # rich wraps long lines
    assert "compare/pw-sweep already exists" in printed
    # the report directory appearing while the jobs run: the failure is an exit too, not a warning
    (root / "compare" / "pw-sweep").rmdir()
    callback.on_multirun_start(config=cfg)
    for job in (0, 1):
        _compare(root, f"pw-{job}", 0.9, job + 1.0)
    (root / "compare" / "pw-sweep").mkdir()
    with pytest.raises(SystemExit) as caught:
        callback.on_multirun_end(config=cfg)
    assert caught.value.code == 2
    assert "sweep report failed" in capsys.readouterr().out
    # overwrite=true, or the report turned off, lets the multirun start
    overwrite = ("output.run_id=pw", "output.overwrite=true")
    cfg_overwrite = _pipeline_config(compose_stage, f"output.root={root}", *overwrite)
    instantiate(cfg.hydra.callbacks.sweep_report).on_multirun_start(config=cfg_overwrite)
    cfg.hydra.callbacks.sweep_report.enabled = False
    instantiate(cfg.hydra.callbacks.sweep_report).on_multirun_start(config=cfg)


def test_pipeline_multirun_with_an_existing_report_exits_2_and_runs_nothing(
    tmp_path: Path,
) -> None:
    (tmp_path / "tmp" / "compare" / "pw-sweep").mkdir(parents=True)
    proc = run_cli("pipeline", "-m", "workload.qps=2,4", "output.run_id=pw",
                   "workload.num_requests=4", cwd=tmp_path, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "pw-sweep already exists" in proc.stdout.replace("\n", "")
    assert sorted(p.name for p in (tmp_path / "tmp").iterdir()) == ["compare"]
