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

from gpu_simulate_test.analysis.stage import run as compare_run
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
