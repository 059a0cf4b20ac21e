"""On Vidur's loop, the lean store (``vidur.lean_metrics``) gives the same results as Vidur's own:
the stage's ``request_metrics.csv`` and ``engine_step_log.csv`` byte for byte, on several
workloads and all three schedulers, from a light load to a burst far above capacity. (Vidur
0.0.26 itself fails an assertion in ``Request.on_batch_stage_end`` once requests are preempted
for lack of KV blocks, with either store, so no case starves the cache.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu_simulate_test.config.schema import OutputConfig
from gpu_simulate_test.config.vidur import (
    VidurConfig,
    VidurPredictorConfig,
    VidurSchedulerConfig,
    VidurSimulateStageConfig,
)
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_json
from gpu_simulate_test.vidur_simulate.stage import run as simulate_run
from tests.vidur_bundle_factory import CPU, QWEN3_TINY, write_synthetic_bundle, write_workload_run

pytestmark = pytest.mark.slow

CASES = {
    # name: (scheduler knobs, requests, rate, prompt range, output range)
    "sarathi-busy": (VidurSchedulerConfig(name="sarathi", batch_size_cap=8, chunk_size=128),
                     150, 200.0, (16, 400), (1, 40)),
    "sarathi-light": (VidurSchedulerConfig(name="sarathi", batch_size_cap=32, chunk_size=256),
                      80, 5.0, (8, 64), (2, 16)),
    "vllm": (VidurSchedulerConfig(name="vllm", batch_size_cap=16, max_tokens_in_batch=512),
             120, 100.0, (16, 300), (1, 32)),
    "orca-cap1": (VidurSchedulerConfig(name="orca", batch_size_cap=1), 40, 20.0, (8, 128),
                  (1, 24)),
    # a burst far above capacity: a long queue, full batches throughout
    "sarathi-burst": (VidurSchedulerConfig(name="sarathi", batch_size_cap=16, chunk_size=128),
                      100, 1e6, (64, 200), (8, 64)),
}  # fmt: skip


@pytest.fixture(scope="module")
def bundle_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lean_metrics")
    write_synthetic_bundle(root / "profiles", QWEN3_TINY, points=12)
    return root


@pytest.mark.parametrize("case", sorted(CASES))
def test_lean_store_matches_vidurs_own(bundle_root: Path, tmp_path: Path, case: str) -> None:
    knobs, n, qps, prompt, output = CASES[case]
    rng = np.random.default_rng(7)
    workload = write_workload_run(
        tmp_path,
        "w",
        rng.integers(prompt[0], prompt[1] + 1, n),
        rng.integers(output[0], output[1] + 1, n),
        np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / qps, n - 1))]),
    )
    runs = {}
    for lean in (False, True):
        cfg = VidurSimulateStageConfig(
            model=QWEN3_TINY,
            hardware=CPU,
            vidur=VidurConfig(
                scheduler=knobs,
                predictor=VidurPredictorConfig(num_training_job_threads=1),
                lean_metrics=lean,
                event_loop="vidur",  # LeanMetrics serves Vidur's loop (ours records its own)
            ),
            workload_dir=str(workload),
            profiling_root=str(bundle_root / "profiles"),
            output=OutputConfig(root=str(tmp_path), run_id=f"lean-{lean}"),
            progress=False,
        )
        runs[lean] = simulate_run(cfg, {})
    full, lean_run = runs[False], runs[True]
    # the two stores did differ: only Vidur's own writes its plots' CSVs
    assert (full / "vidur" / "plots").is_dir()
    assert not (lean_run / "vidur" / "plots").exists()
    for name in (layout.REQUEST_METRICS, layout.ENGINE_STEP_LOG):
        assert (lean_run / name).read_bytes() == (full / name).read_bytes(), (case, name)
    assert read_json(full / layout.RUN_META)["summary"]["num_requests"] == n
    assert (lean_run / layout.REQUEST_METRICS).read_text().count("\n") == n + 1
