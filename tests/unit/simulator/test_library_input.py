"""The simulator library refuses what no simulation can read, naming the field, where it ran on
or failed deep inside: arrays of other lengths, arrivals negative or infinite, token counts that
are not whole, knobs below 1, a host level that is not a factor, a batch beyond what the step
model was opened for."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.core.traffic.workloads import write_workload_arrays
from gpu_simulate_test.simulator.api import FleetSpec, Workload, simulate
from gpu_simulate_test.simulator.types import V1Params
from gpu_simulate_test.vidur_profile.synthetic import CPU, QWEN3_TINY, write_synthetic_bundle
from gpu_simulate_test.vidur_simulate.opening import Simulation, open_simulation
from tests.conftest import REPO_ROOT

Q20 = REPO_ROOT / "tests" / "data" / "vllm" / "frontend_queue" / "q20" / "request_metrics.csv"


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        (([0.0, 1.0], [10], [5, 5]), r"prompt_tokens has shape \(1,\), expected one"),
        (([0.0], [10, 20], [5, 5]), r"prompt_tokens has shape \(2,\), expected one value a"),
        (([[0.0]], [10], [5]), r"Workload.arrival_s has shape \(1, 1\), expected a 1-D array"),
        (([-5.0, 0.1], [10, 20], [5, 5]), r"arrival_s\[0\] is -5.0, expected a time in seconds"),
        (([0.0, np.inf], [10, 20], [5, 5]), r"arrival_s\[1\] is inf"),
        (([0.0, np.nan], [10, 20], [5, 5]), r"arrival_s\[1\] is nan.*NaN only for a closed loop"),
        (([0.0], [10.7], [5]), r"Workload.prompt_tokens\[0\] is 10.7, expected a whole number"),
        (([0.0], [10], [np.nan]), r"Workload.output_tokens\[0\] is nan"),
        (([0.0], ["ten"], [5]), r"Workload.prompt_tokens\[0\] is 'ten'"),
        (([0.0], [10], [True]), r"Workload.output_tokens\[0\] is True"),
    ],
)  # fmt: skip
def test_a_workload_no_simulation_can_read_is_refused(arrays: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Workload.of(*arrays)


def test_what_a_workload_may_hold_is_read() -> None:
    w = Workload.of(np.array([0.5, 0.0]), [10, 20.0], np.array([5, 6], dtype=np.int32))
    assert w.prompt_tokens.tolist() == [10, 20] and w.output_tokens.dtype == np.int64
    with pytest.raises(ValueError, match=r"Workload.routed_at has shape \(1,\)"):
        dataclasses.replace(w, routed_at=np.array([0.0]))
    with pytest.raises(ValueError, match=r"Workload.after has 1 entries, expected 2"):
        dataclasses.replace(w, after=[(-1, 0.0)])
    closed = dataclasses.replace(w, arrival_s=np.array([0.0, np.nan]), after=[(1, 0.1), (-1, 0.0)])
    assert np.isnan(closed.arrival_s[1])  # a later turn, sent by the one before


@pytest.mark.parametrize(
    ("knobs", "name"),
    [({"max_num_seqs": 0}, "max_num_seqs is 0"), ({"block_size": 0}, "block_size is 0"),
     ({"max_num_batched_tokens": 30.5}, "max_num_batched_tokens is 30.5"),
     ({"block_size": "16"}, "block_size is '16'"),
     ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold is -1")],
)  # fmt: skip
def test_knobs_below_one_are_named(knobs: dict[str, Any], name: str) -> None:
    base: dict[str, Any] = {
        "max_num_batched_tokens": 64,
        "max_num_seqs": 4,
        "block_size": 16,
        "num_blocks": 64,
    }
    with pytest.raises(ValueError, match=rf"V1Params\.{name}, expected a whole number"):
        V1Params(**{**base, **knobs})
    V1Params(**{**base, "max_num_seqs": np.int64(4)})  # a numpy count is a count


@pytest.mark.parametrize("replicas", [2.5, "2", True])
def test_a_fleet_size_that_is_not_a_count_is_named(replicas: Any) -> None:
    with pytest.raises(ValueError, match=r"fleet.replicas must be a whole number"):
        FleetSpec(replicas)


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Simulation:
    root = tmp_path_factory.mktemp("library")
    requests = pd.read_csv(Q20)
    workload_dir = write_workload_arrays(root, "q20", requests["num_prefill_tokens"],
        requests["num_decode_tokens"], requests["arrival_time_s"], QWEN3_TINY)  # fmt: skip
    write_synthetic_bundle(root / "profiles", QWEN3_TINY)
    return open_simulation(workload_dir, root / "profiles", QWEN3_TINY, CPU, work_dir=root)


@pytest.mark.parametrize("level", [0.0, -1.0, float("nan"), float("inf")])
def test_a_host_level_that_is_not_a_factor_is_refused(sim: Simulation, level: float) -> None:
    with pytest.raises(ValueError, match=r"at_level\(.*\): the level must be a positive factor"):
        sim.step_model.at_level(level)


def test_a_batch_beyond_the_opened_workload_says_so(sim: Simulation) -> None:
    longest = int(sim.workload.prompt_tokens.max())
    fits = Workload.of([0.0], [longest], [1])
    assert len(simulate(fits, sim.step_model, sim.engine).requests) == 1
    beyond = Workload.of([0.0], [8 * longest], [1])
    with pytest.raises(ValueError, match=r"no time for a batch of shape .*\(open_simulation\)"):
        simulate(beyond, sim.step_model, sim.engine)
    with pytest.raises(ValueError, match=r"no time for a batch of shape"):
        simulate(beyond, sim.step_model, sim.engine, fleet=FleetSpec(2))


def test_a_batch_beyond_the_opened_workload_says_so_for_its_clocks_too(sim: Simulation) -> None:
    beyond = Workload.of([0.0, 0.0], [8 * int(sim.workload.prompt_tokens.max()), 10], [1, 1])
    model = sim.step_model
    with pytest.raises(ValueError, match=r"no time for a batch of shape .*\(open_simulation\)"):
        simulate(beyond, model.clock(0), sim.engine)
    with pytest.raises(ValueError, match=r"no time for a batch of shape"):
        simulate(beyond, [model.clock(0), model.clock(1)], sim.engine, fleet=FleetSpec(2))
