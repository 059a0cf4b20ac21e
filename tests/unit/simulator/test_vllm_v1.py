"""vLLM's V1 scheduler in our event loop: step for step against a real vLLM run (its own
recorded steps, preemptions included), and the rules of ``vllm/v1/core/sched/scheduler.py`` one by
one on small cases."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.simulator.run import run_v1
from gpu_simulate_test.simulator.types import Composition, V1Params
from gpu_simulate_test.vidur_simulate import oracle

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm" / "step_record"
KEY = list(oracle.KEY)


class Fixed:
    """Every step takes ``body`` seconds, back to back."""

    def __init__(self, body: float = 0.01) -> None:
        self.body_s = body

    def gap(self, index: int) -> float:
        return 0.0

    def lead(self, index: int) -> float:
        return 0.0

    def body(self, index: int, step: Composition) -> float:
        return self.body_s


def real_run() -> tuple[V1Params, pd.DataFrame, pd.DataFrame]:
    backend = json.loads((DATA / "run_meta.json").read_text())["config"]["backend"]
    params = V1Params(
        max_num_batched_tokens=backend["max_batch_tokens"],
        max_num_seqs=backend["max_requests_per_batch"],
        block_size=backend["block_size"],
        num_blocks=backend["num_blocks"],
    )
    schedule = pd.read_csv(DATA / "engine_schedule.csv")
    requests = pd.read_csv(DATA / "request_metrics.csv").sort_values("request_id")
    return params, schedule, requests


def test_an_oracle_replay_takes_vllm_s_steps_one_for_one_preemptions_included() -> None:
    params, schedule, requests = real_run()
    queued = requests["engine_arrival_time_s"].to_numpy()
    clock = oracle.from_schedule(schedule, queued)
    result = run_v1(
        params,
        clock,
        queued,
        requests["num_prefill_tokens"].to_numpy(),
        requests["num_decode_tokens"].to_numpy(),
    )
    sim = result.schedule
    assert len(sim) == len(schedule) == 661
    assert (sim[KEY].to_numpy() == schedule[KEY].to_numpy()).all()
    assert (sim["requests"] == schedule["requests"]).all()  # the same requests, same tokens
    assert result.preemptions == schedule["num_preempted"].sum() == 10
    assert clock.report()["same_position_fraction"] == 1.0
    # with the engine's own times, every request's engine TTFT and E2E are the engine's
    rows = result.requests
    ttft = requests["engine_first_token_time_s"] - requests["engine_arrival_time_s"]
    e2e = requests["engine_last_token_time_s"] - requests["engine_arrival_time_s"]
    np.testing.assert_allclose(rows["prefill_e2e_time"], ttft, atol=1e-9)
    np.testing.assert_allclose(rows["request_e2e_time"], e2e, atol=1e-9)
    assert rows["request_num_restarts"].sum() == 10


def test_a_changed_rule_is_caught_by_the_replay() -> None:
    """The replay can fail: one more KV block and vLLM's preemptions no longer happen."""
    params, schedule, requests = real_run()
    queued = requests["engine_arrival_time_s"].to_numpy()
    bigger = V1Params(params.max_num_batched_tokens, params.max_num_seqs, params.block_size, 17)
    result = run_v1(
        bigger,
        oracle.from_schedule(schedule, queued),
        queued,
        requests["num_prefill_tokens"].to_numpy(),
        requests["num_decode_tokens"].to_numpy(),
    )
    n = min(len(result.schedule), len(schedule))
    same = (result.schedule[KEY].to_numpy()[:n] == schedule[KEY].to_numpy()[:n]).all(axis=1)
    assert result.preemptions < 10
    assert len(result.schedule) != len(schedule) or not same.all()


def run(params: V1Params, arrivals: list[float], prompts: list[int], outputs: list[int]):
    return run_v1(params, Fixed(), np.array(arrivals), np.array(prompts), np.array(outputs))


def test_running_requests_spend_the_budget_first_then_a_chunk_of_a_waiting_prompt() -> None:
    params = V1Params(max_num_batched_tokens=16, max_num_seqs=8, block_size=16, num_blocks=64)
    result = run(params, [0.0, 0.0, 0.015], [10, 40, 8], [3, 2, 2])
    steps = result.schedule
    # step 0: 10 of request 0, 6 of request 1 (chunked); step 1: request 0 decodes, 15 of 1
    assert steps["requests"].iloc[0] == "0:10 1:6"
    assert steps["requests"].iloc[1] == "0:1 1:15"
    # request 2 arrived during step 1: it waits for the running ones, then takes what is left
    assert steps["requests"].iloc[2] == "0:1 1:15"
    assert steps.loc[2, KEY].tolist() == [1, 15, 1, 1]
    assert steps["requests"].iloc[3] == "1:4 2:8"
    assert result.requests["request_num_restarts"].sum() == 0


def test_max_num_seqs_caps_the_running_set() -> None:
    params = V1Params(max_num_batched_tokens=64, max_num_seqs=2, block_size=16, num_blocks=64)
    result = run(params, [0.0, 0.0, 0.0], [4, 4, 4], [3, 3, 3])
    steps = result.schedule
    assert steps["requests"].iloc[0] == "0:4 1:4"  # the third waits for a free seat
    assert steps["requests"].iloc[3] == "2:4"
    assert (steps["num_prefill_requests"] + steps["num_decode_requests"]).max() == 2


def test_out_of_blocks_the_last_running_request_is_preempted_and_recomputes() -> None:
    # 4 usable blocks of 4 tokens: two requests of 4 + 6 tokens cannot both finish
    params = V1Params(max_num_batched_tokens=64, max_num_seqs=8, block_size=4, num_blocks=5)
    result = run(params, [0.0, 0.0], [4, 4], [6, 6])
    steps = result.schedule
    assert steps["requests"].iloc[0] == "0:4 1:4"  # 2 blocks held
    hit = steps.index[steps["num_preempted"] > 0]
    assert len(hit) and result.preemptions >= 1
    first = hit[0]
    # the newest request (the last running) gave way; nobody was admitted in that step
    assert "1:" not in steps["requests"].iloc[first]
    assert steps["num_waiting"].iloc[first] == 1
    # when it comes back it recomputes prompt and output as one generation chunk (vLLM's count)
    back = next(i for i in range(first + 1, len(steps)) if "1:" in steps["requests"].iloc[i])
    tokens = int(steps["requests"].iloc[back].split("1:")[1].split()[0])
    assert tokens > 1 and steps["num_decode_tokens"].iloc[back] >= tokens
    rows = result.requests
    assert rows["request_num_restarts"].tolist() == [0, result.preemptions]
    assert np.isfinite(rows["request_e2e_time"]).all()


def test_a_waiting_request_needs_blocks_for_all_its_tokens() -> None:
    # 5 usable blocks; request 0 grows to 4 of them. The budget would fit a 7-token chunk of
    # request 1 (2 blocks, free), but all its 16 tokens need 4: it waits for request 0 to finish
    params = V1Params(max_num_batched_tokens=8, max_num_seqs=8, block_size=4, num_blocks=6)
    result = run(params, [0.0, 0.001], [8, 16], [8, 2])
    steps = result.schedule
    admitted = next(i for i in range(len(steps)) if "1:" in steps["requests"].iloc[i])
    assert admitted > 1  # held back until request 0 freed its blocks
    assert "0:" not in steps["requests"].iloc[admitted]


def test_a_request_bigger_than_the_cache_is_refused() -> None:
    params = V1Params(max_num_batched_tokens=64, max_num_seqs=8, block_size=4, num_blocks=3)
    with pytest.raises(ValueError, match="more KV blocks than the cache has"):
        run(params, [0.0], [8], [4])
