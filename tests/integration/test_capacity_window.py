"""``capacity.sim_window``: each simulated rate judges the requests the real search replays at
that rate (the workload's first ⌈rate × verify_seconds⌉, at least ``verify_min_requests``), at the
same arrival times; off, every rate judges the whole workload (simulated only; no engine)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.capacity import contract
from gpu_simulate_test.config.capacity import CapacityOptions
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv
from gpu_simulate_test.vidur_simulate.inputs import first_requests
from tests.conftest import run_cli
from tests.vidur_bundle_factory import (
    SyntheticRanges,
    synthetic_inputs,
    write_synthetic_bundle,
)

pytestmark = pytest.mark.integration

BLOCK = 32
REQUESTS = 120
SEARCH = (
    "backend=vllm", "engine_overhead=false", "profiling_root=profiles",
    f"workload.num_requests={REQUESTS}", "capacity.slo.ttft_ms=3", "capacity.slo.tpot_ms=0",
    "capacity.qps_min=1", "capacity.qps_max=10000", "capacity.points=6", "capacity.refine=2",
    "capacity.step_band=0", "capacity.verify_seconds=0.5", "capacity.verify_min_requests=8",
    "vidur.predictor.num_training_job_threads=1", "progress=false",
)  # fmt: skip
"""The synthetic bundle's steps take well under a millisecond: a 3 ms TTFT goal puts the knee
inside the grid; half a second of arrivals is 8 requests (the floor) at 1 req/s and the whole
workload from 240 req/s."""


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("capacity_window")
    write_synthetic_bundle(root / "profiles", ranges=SyntheticRanges(block_size=BLOCK))
    run_cli("capacity", *SEARCH, "capacity.sim_window=true", "output.run_id=window", cwd=root)
    run_cli("capacity", *SEARCH, "output.run_id=whole", cwd=root)
    return root


def _points(run: Path) -> dict[float, pd.DataFrame]:
    rates = read_csv(run / contract.CAPACITY_CSV, contract.CAPACITY_TABLE)["qps"].tolist()
    return {
        qps: pd.read_csv(run / contract.POINTS_DIR / f"{qps:g}" / "request_metrics.csv")
        for qps in rates
    }


def test_each_rate_judges_the_real_searchs_requests_at_their_times(root: Path) -> None:
    run = root / "tmp" / "capacity" / "window"
    arrivals = pd.read_csv(run / "runs" / "workload" / "base" / layout.TRACE_INTERVALS)
    base = arrivals["arrival_time_s"].to_numpy()
    lengths = pd.read_csv(run / "runs" / "workload" / "base" / layout.TRACE_LENGTHS)
    prompts = lengths["num_prefill_tokens"].tolist()
    opts = CapacityOptions(verify_seconds=0.5, verify_min_requests=8)
    points = _points(run)
    counts = {qps: len(raw) for qps, raw in points.items()}
    assert min(counts.values()) == 8 and max(counts.values()) == REQUESTS, counts
    for qps, raw in points.items():
        expected = min(REQUESTS, max(8, math.ceil(qps * 0.5 - 1e-9)))
        assert len(raw) == expected == min(REQUESTS, opts.requests_at(qps)), qps
        assert sorted(raw["Request Id"]) == list(range(expected))  # the first ones
        trace = pd.read_csv(run / contract.POINTS_DIR / f"{qps:g}" / "trace.csv")
        assert trace["PromptTokenCount"].tolist() == prompts[:expected]
        # no front end here (engine_overhead=false): sent is when the scheduler has it
        assert trace["Time"].to_numpy() == pytest.approx(base[:expected] / qps, abs=1e-6)
    doc: dict[str, Any] = json.loads((run / contract.CAPACITY_JSON).read_text())
    assert doc["sim_window"] == {"seconds": 0.5, "min_requests": 8, "max_requests": None}
    assert doc["num_requests"] == REQUESTS
    report = (run / contract.REPORT_MD).read_text()
    assert f"the first ⌈rate × 0.5 s⌉ of {REQUESTS} requests, at least 8" in report


def test_without_the_window_every_rate_judges_the_whole_workload(root: Path) -> None:
    run = root / "tmp" / "capacity" / "whole"
    assert {len(raw) for raw in _points(run).values()} == {REQUESTS}
    doc = json.loads((run / contract.CAPACITY_JSON).read_text())
    assert doc["sim_window"] is None
    assert f"{REQUESTS} requests per rate" in (run / contract.REPORT_MD).read_text()
    # the search under three noise seeds (capacity.sim_seeds), the median one answering
    seeds = doc["sim_seeds"]
    assert seeds["count"] == 3 and seeds["seeds"] == [42, 43, 44]
    assert doc["answer_qps"] == sorted(seeds["answers_qps"])[1]
    assert seeds["chosen_seed"] == 42 + seeds["answers_qps"].index(doc["answer_qps"])
    for seed in (43, 44):  # a later seed's own points
        assert (run / contract.POINTS_DIR / f"seed-{seed}").is_dir()
    assert "Seeds: the search under 3 noise seeds (42–44)" in (run / contract.REPORT_MD).read_text()


def test_first_requests_slices_every_per_request_field(root: Path, compose_stage: Any) -> None:
    base = root / "tmp" / "capacity" / "window" / "runs" / "workload" / "base"
    inputs = synthetic_inputs(compose_stage, base, root / "profiles", BLOCK)
    head = first_requests(inputs, 10)
    assert len(head.workload.lengths) == len(head.workload.intervals) == 10
    assert np.array_equal(head.prefill, inputs.prefill[:10])
    assert np.array_equal(head.decode, inputs.decode[:10])
    assert np.array_equal(head.arrival_time_s, inputs.arrival_time_s[:10])
    assert head.workload.lengths.equals(inputs.workload.lengths.iloc[:10])
    assert first_requests(inputs, REQUESTS) is inputs  # the whole workload: nothing to cut
    with pytest.raises(ValueError, match="count must be >= 1"):
        first_requests(inputs, 0)
