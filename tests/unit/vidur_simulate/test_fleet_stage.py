"""``vidur_simulate fleet.replicas=N fleet.router=...``: the stage simulates N ``vllm_v1``
engines behind the router, writes each request's and each step's engine, and reports the
requests and latency per replica; one replica is the one-engine run; a fleet of Vidur's
schedulers is refused by name."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.config.fleet import FLEET_ROUTERS, FleetConfig
from gpu_simulate_test.config.schema import ConfigError, OutputConfig
from gpu_simulate_test.config.vidur import (
    VidurConfig,
    VidurPredictorConfig,
    VidurSimulateStageConfig,
)
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_json
from gpu_simulate_test.simulator.routers import ROUTERS
from gpu_simulate_test.vidur_simulate.stage import run as simulate_run
from tests.unit.vidur_simulate.test_vidur_event_loop import arrivals, knobs
from tests.vidur_bundle_factory import CPU, QWEN3_TINY, write_synthetic_bundle, write_workload_run

N = 120


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("fleet_stage")
    bundle = root / "bundle"
    write_synthetic_bundle(bundle, QWEN3_TINY, points=12)
    rng = np.random.default_rng(5)
    workload = write_workload_run(
        root, "w", rng.integers(16, 200, N), rng.integers(2, 24, N), arrivals(rng, N, 400.0)
    )
    return workload, bundle


def stage(root: Path, run_id: str, inputs: tuple[Path, Path], fleet: FleetConfig,
          scheduler: str = "vllm_v1") -> Path:  # fmt: skip
    workload, bundle = inputs
    cfg = VidurSimulateStageConfig(
        model=QWEN3_TINY,
        hardware=CPU,
        vidur=VidurConfig(
            scheduler=knobs(scheduler, 8, max_tokens_in_batch=256),
            predictor=VidurPredictorConfig(num_training_job_threads=1),
            engine_overhead="none",
            step_jitter=False,
            frontend_latency=False,
        ),
        workload_dir=str(workload),
        profiling_root=str(bundle),
        fleet=fleet,
        output=OutputConfig(root=str(root), run_id=run_id),
        progress=False,
    )
    return simulate_run(cfg, {})


def test_every_router_name_is_registered() -> None:
    assert set(FLEET_ROUTERS) == set(ROUTERS)


@pytest.mark.parametrize("router", ["vllm_dp", "round_robin"])
def test_two_replicas_split_the_load_and_say_where_each_request_ran(
    inputs: tuple[Path, Path], tmp_path: Path, router: str
) -> None:
    one = stage(tmp_path, "one", inputs, FleetConfig())
    two = stage(tmp_path, "two", inputs, FleetConfig(replicas=2, router=router))
    rows = pd.read_csv(two / layout.REQUEST_METRICS)
    assert sorted(set(rows["engine"])) == [0, 1]
    steps = pd.read_csv(two / layout.ENGINE_STEP_LOG)
    assert sorted(set(steps["engine"])) == [0, 1]
    assert "engine" not in pd.read_csv(one / layout.REQUEST_METRICS).columns
    meta = read_json(two / layout.RUN_META)["fleet"]
    assert meta["replicas"] == 2 and meta["router"] == router
    counts = [r["requests"] for r in meta["per_replica"]]
    assert sum(counts) == N and min(counts) >= N // 3
    assert read_json(one / layout.RUN_META)["fleet"] is None
    # twice the engines at a load one engine queues under: first tokens come sooner
    single = read_json(one / layout.RUN_META)["summary"]["ttft_s"]["p90"]
    double = read_json(two / layout.RUN_META)["summary"]["ttft_s"]["p90"]
    assert double < 0.8 * single, (double, single)


def test_one_replica_is_the_one_engine_run(inputs: tuple[Path, Path], tmp_path: Path) -> None:
    plain = stage(tmp_path, "plain", inputs, FleetConfig())
    named = stage(tmp_path, "named", inputs, FleetConfig(replicas=1, router="random"))
    for name in (layout.REQUEST_METRICS, layout.ENGINE_STEP_LOG):
        assert (plain / name).read_bytes() == (named / name).read_bytes()


def test_a_fleet_of_vidurs_schedulers_is_refused(inputs: tuple[Path, Path], tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"vidur\.scheduler\.name=vllm_v1"):
        stage(tmp_path, "x", inputs, FleetConfig(replicas=2), scheduler="sarathi")
    with pytest.raises(ConfigError, match=r"fleet\.router"):
        FleetConfig(replicas=2, router="nearest")
