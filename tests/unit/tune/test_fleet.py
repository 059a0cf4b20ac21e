"""How many GPUs: the fleet's knobs in the space (ids, the one-replica collapse, the configured
fleet, the real server's data-parallel size), the seed scaled by replicas, the fewest GPUs that
meet a target rate and the frontier of GPUs against capacity."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_simulate_test.capacity.search import Answer
from gpu_simulate_test.config.backends import (
    ServerConfig,
    VllmBackendConfig,
    VllmEngineBackendConfig,
)
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.tune import TuneOptions, knob_values
from gpu_simulate_test.tune import simulate
from gpu_simulate_test.tune.fleet import frontier, target_answer
from gpu_simulate_test.tune.simulate import Simulated, fleet_groups, fleet_scale, nearest
from gpu_simulate_test.tune.space import calibration_backend, candidates, deployment
from gpu_simulate_test.tune.verdict import verdict_lines
from tests.vidur_bundle_factory import QWEN3_TINY

BACKEND = VllmBackendConfig(max_num_batched_tokens=128, max_num_seqs=8, num_gpu_blocks_override=256)


def space(**knobs: Any) -> list[Any]:
    return candidates(TuneOptions(space=knobs), BACKEND, QWEN3_TINY, 80)


def test_the_fleet_s_knobs_are_checked_by_name() -> None:
    assert knob_values("replicas", "1:8:x2") == (1, 2, 4, 8)
    assert knob_values("router", ["vllm_dp", "round_robin"]) == ("vllm_dp", "round_robin")
    with pytest.raises(ConfigError, match="'nearest' is not a router; the routers are vllm_dp"):
        knob_values("router", ["nearest"])
    with pytest.raises(ConfigError, match="positive whole number"):
        knob_values("replicas", [0])
    with pytest.raises(ConfigError, match=r"set tune\.objective=capacity"):
        TuneOptions(objective="goodput", qps=5.0, verify="false", target_qps=10.0)
    with pytest.raises(ConfigError, match=r"target_qps=-1\.0"):
        TuneOptions(target_qps=-1.0)


def test_one_replica_is_listed_once_and_a_fleet_per_router() -> None:
    found = space(max_num_seqs=[2, 8], replicas=[1, 2], router=["vllm_dp", "round_robin"])
    assert [c.config_id for c in found] == [
        "r1-s2", "r1-s8", "r2-dp-s2", "r2-dp-s8", "r2-rr-s2", "r2-rr-s8",
    ]  # fmt: skip
    assert [c.configured for c in found] == [False, True, False, False, False, False]
    by_id = {c.config_id: c for c in found}
    # vLLM's own balancer is one --data-parallel-size server; another router's are N servers
    assert by_id["r2-dp-s8"].backend.data_parallel_size == 2
    assert by_id["r2-rr-s8"].backend.data_parallel_size == 1
    assert (by_id["r2-rr-s8"].backend.servers, by_id["r2-rr-s8"].backend.router) == (
        2, "round_robin",
    )  # fmt: skip
    assert by_id["r2-dp-s8"].backend.servers == 1 and by_id["r1-s8"].backend.servers == 1
    assert by_id["r2-rr-s8"].fleet.router == "round_robin" and by_id["r2-rr-s8"].gpus == 2
    # one value of each: no fleet in the ids (the default space's)
    assert [c.config_id for c in space(max_num_seqs=[2, 8], replicas=[1])] == ["s2", "s8"]
    # the calibration times one engine, whatever the fleets
    assert calibration_backend(found).data_parallel_size == 1
    assert calibration_backend(found).servers == 1
    # both fleets are served by the real bench: one -dp 2 server, or 2 servers behind the client
    assert by_id["r2-dp-s8"].checkable and by_id["r2-rr-s8"].checkable
    assert by_id["r1-s8"].checkable and by_id["r1-s8"].routed_by is None
    assert by_id["r2-rr-s8"].routed_by == "round_robin"
    # vLLM's engine in process has no data-parallel server: its fleets are simulated only
    engine = VllmEngineBackendConfig(max_num_batched_tokens=128, max_num_seqs=8)
    fleet = candidates(TuneOptions(space={"replicas": [1, 2]}), engine, QWEN3_TINY, 80)
    assert [c.checkable for c in fleet] == [True, False]


def test_the_configured_fleet_is_the_backend_s_data_parallel_size() -> None:
    backend = VllmBackendConfig(
        max_num_batched_tokens=128,
        max_num_seqs=8,
        num_gpu_blocks_override=256,
        data_parallel_size=2,
    )
    found = candidates(TuneOptions(space={"replicas": [1, 2, 4]}), backend, QWEN3_TINY, 80)
    assert [(c.config_id, c.configured) for c in found] == [
        ("r1", False), ("r2", True), ("r4", False),
    ]  # fmt: skip
    # N servers behind the client's router are a configured fleet too, and checkable
    served = VllmBackendConfig(
        max_num_batched_tokens=128, max_num_seqs=8, num_gpu_blocks_override=256, servers=2,
        router="least_outstanding",
    )  # fmt: skip
    opts = TuneOptions(space={"replicas": [1, 2], "router": ["vllm_dp", "least_outstanding"]})
    found = candidates(opts, served, QWEN3_TINY, 80)
    assert [(c.config_id, c.configured, c.checkable) for c in found] == [
        ("r1", False, True), ("r2-dp", False, True), ("r2-lo", True, True),
    ]  # fmt: skip
    # servers you run yourself (server.kind=external) cannot be multiplied: simulated only
    external = VllmBackendConfig(
        max_num_batched_tokens=128, max_num_seqs=8, num_gpu_blocks_override=256,
        server=ServerConfig(kind="external"),
    )  # fmt: skip
    opts = TuneOptions(space={"replicas": [1, 2], "router": ["round_robin"]})
    assert [c.checkable for c in candidates(opts, external, QWEN3_TINY, 80)] == [True, False]


def test_the_seed_of_a_fleet_is_its_neighbour_s_capacity_times_the_replicas() -> None:
    found = space(max_num_seqs=[2, 8], replicas=[1, 4])
    by_id = {c.config_id: c for c in found}
    done = {"r1-s8": Simulated(by_id["r1-s8"], Answer(40.0, (40.0, 42.0)))}
    candidate, seed = nearest([by_id["r4-s8"], by_id["r4-s2"]], done, 1.0)
    assert candidate.config_id == "r4-s8" and seed == pytest.approx(160.0)
    # once a pair of fleets is known, their ratio seeds the next pair (queueing gains included)
    done["r4-s8"] = Simulated(by_id["r4-s8"], Answer(180.0, (180.0, 189.0)))
    done["r1-s2"] = Simulated(by_id["r1-s2"], Answer(10.0, (10.0, 10.5)))
    answered = list(done.values())
    assert fleet_scale(by_id["r4-s2"], by_id["r1-s2"], answered) == pytest.approx(4.5)
    assert fleet_scale(by_id["r1-s2"], by_id["r4-s8"], answered) == pytest.approx(1 / 4.5)
    assert fleet_scale(by_id["r4-s2"], by_id["r4-s8"], answered) == 1.0
    # before any configuration ran with both fleets: the ratio of their replicas
    assert fleet_scale(by_id["r4-s2"], by_id["r1-s2"], answered[:1]) == pytest.approx(4.0)


def _sim(candidate: Any, capacity: float | None) -> Simulated:
    answer = None if capacity is None else Answer(capacity, (capacity, None))
    return Simulated(candidate, answer)


def test_the_fewest_gpus_that_meet_the_target_and_the_frontier() -> None:
    found = space(max_num_seqs=[2, 8], replicas=[1, 2, 4], router=["vllm_dp", "round_robin"])
    by_id = {c.config_id: c for c in found}
    capacities = {
        "r1-s2": 20.0, "r1-s8": 45.0, "r2-dp-s2": 41.0, "r2-dp-s8": 95.0,
        "r2-rr-s2": 40.0, "r2-rr-s8": 92.0, "r4-dp-s2": 80.0, "r4-dp-s8": None,
        "r4-rr-s2": 81.0, "r4-rr-s8": 90.0,
    }  # fmt: skip
    order = [_sim(by_id[k], v) for k, v in capacities.items()]
    answer = target_answer(order, 60.0, "Qwen/Qwen3-0.6B")
    assert (answer["gpus"], answer["config_id"], answer["router"]) == (2, "r2-dp-s8", "vllm_dp")
    assert answer["headroom_pct"] == pytest.approx(58.3)
    assert answer["deploy"]["command"].startswith(
        "vllm serve Qwen/Qwen3-0.6B --data-parallel-size 2 --max-num-seqs 8"
    )
    assert target_answer(order, 30.0, "m")["gpus"] == 1
    missing = target_answer(order, 500.0, "m")
    assert missing["gpus"] is None and "the most: 95 req/s, r2-dp-s8" in missing["note"]
    # configurations meet the goals, none reaches the target: said so, not "meets no goals"
    said = verdict_lines({"best": None, "note": "", "target": missing})
    assert said == [
        "No configuration reaches tune.target_qps=500: no configuration of the space reaches "
        "500 req/s within the goals (the most: 95 req/s, r2-dp-s8): add replicas to "
        "tune.space.replicas"
    ]
    assert verdict_lines({"best": None, "note": "ttft_p90 binds"}) == [
        "No configuration meets the goals: ttft_p90 binds"
    ]
    # 4 GPUs serve no more than 2 (90 < 95): off the frontier
    assert [(f["gpus"], f["config_id"]) for f in frontier(order)] == [
        (1, "r1-s8"), (2, "r2-dp-s8"),
    ]  # fmt: skip
    rr = deployment(by_id["r4-rr-s8"], "m")
    assert rr["servers"] == 4 and rr["router"] == "round_robin" and "--port" in rr["command"]


def test_a_few_engines_are_a_task_after_one_fleet_of_each_kind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    found = space(max_num_seqs=[2, 8, 16], replicas=[1, 2, 4], router=["vllm_dp", "round_robin"])
    first = next(c for c in found if c.configured)
    leading, groups = fleet_groups(found, first)
    # one after another: each fleet kind on the configured engine (s8), nearest the first
    assert [c.config_id for c in leading] == ["r2-dp-s8", "r2-rr-s8", "r4-dp-s8", "r4-rr-s8"]
    # then each engine with its fleets, a few engines a task
    assert [[c.config_id for c in g] for g in groups] == [
        ["r1-s2", "r2-dp-s2", "r2-rr-s2", "r4-dp-s2", "r4-rr-s2",
         "r1-s16", "r2-dp-s16", "r2-rr-s16", "r4-dp-s16", "r4-rr-s16"],
    ]  # fmt: skip
    # an engine stays in one task (fixed: any number of workers, one answer)
    monkeypatch.setattr(simulate, "GROUP_ENGINES", 1)
    _, groups = fleet_groups(found, first)
    assert [{c.knobs["max_num_seqs"] for c in g} for g in groups] == [{2}, {16}]
    # no fleet: every configuration one after another, as before (each seeds the next)
    flat = space(max_num_seqs=[2, 8, 16])
    leading, groups = fleet_groups(flat, next(c for c in flat if c.configured))
    assert len(leading) == 2 and groups == []


def test_the_real_check_measures_the_answer_to_the_target_not_only_the_largest_fleets() -> None:
    from types import SimpleNamespace

    from gpu_simulate_test.tune.verify import chosen

    found = space(max_num_seqs=[8], replicas=[1, 2, 4])
    by_replicas = {c.replicas: c for c in found}
    capacities = {1: 45.0, 2: 95.0, 4: 180.0}
    order = [_sim(by_replicas[n], capacities[n]) for n in (4, 2, 1)]  # ranked by capacity
    cfg: Any = SimpleNamespace(tune=TuneOptions(target_qps=60.0, top_k=1))
    picked = [s.candidate.replicas for s in chosen(order, cfg)]
    # the top by capacity (4 GPUs), the recommendation for 60 req/s (2 GPUs), the configured
    assert picked == [4, 2, 1]
    plain: Any = SimpleNamespace(tune=TuneOptions(top_k=1))  # no target: the top and configured
    assert [s.candidate.replicas for s in chosen(order, plain)] == [4, 1]
