"""A fleet, real against simulated: the routing table (requests per replica on each side), the
share sent to the same replica, each replica's latency on the engine's clock; a note where only
one side is a fleet, nothing where neither is."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.compare.routing import compare_routing, routing_markdown
from gpu_simulate_test.core.engines.router_reads import READ_BY_CLIENT
from tests.unit.compare.test_compare_clocks import _joined


def _real(engines: list[float]) -> pd.DataFrame:
    n = len(engines)
    return pd.DataFrame(
        {
            "request_id": np.arange(n),
            "engine_ttft_s": [0.010 * (1 + e) if e == e else np.nan for e in engines],
            "engine_tpot_s": [0.009] * n,
            "engine_e2e_s": [0.100] * n,
            "engine": pd.array([None if e != e else int(e) for e in engines], dtype="Int64"),
        }
    )


def _sim(engines: list[int]) -> pd.DataFrame:
    return pd.DataFrame({"request_id": np.arange(len(engines)), "engine": engines})


def test_the_routing_table_counts_each_replica_and_the_same_replica_share() -> None:
    real = _real([0, 1, 0, 1])
    block = compare_routing(real, _sim([0, 1, 1, 1]), _joined(4))
    assert block is not None and block["replicas"] == 2 and block["compared"] == 4
    assert block["same_replica_fraction"] == pytest.approx(0.75)
    zero, one = block["per_replica"]
    assert (zero["real_requests"], zero["sim_requests"]) == (2, 1)
    assert (one["real_requests"], one["sim_requests"]) == (2, 3)
    assert block["largest_count_gap_pct"] == pytest.approx(50.0)
    # latency per replica, engine clock: real engine 1's TTFT is 20 ms, engine 0's 10 ms
    assert zero["real_ttft_p50_ms"] == pytest.approx(10.0)
    assert one["real_ttft_p50_ms"] == pytest.approx(20.0)
    assert zero["sim_ttft_p50_ms"] == pytest.approx(22.0)  # the joined sim side, no front end
    text = routing_markdown(block)
    assert "75.0% of 4 compared requests" in text and "| 1 | 2 (50%) | 3 (75%) |" in text


def test_a_request_that_reached_no_engine_is_not_judged() -> None:
    block = compare_routing(_real([0, np.nan, 1, 1]), _sim([0, 0, 1, 0]), _joined(4))
    assert block is not None and block["compared"] == 3
    assert block["same_replica_fraction"] == pytest.approx(2 / 3)


def test_one_side_alone_a_fleet_is_said_and_no_fleet_gives_nothing() -> None:
    joined = _joined(4)
    real = _real([0, 1, 0, 1])
    one = real.drop(columns=["engine"])
    only_real = compare_routing(real, _sim([0, 0, 0, 0]).drop(columns=["engine"]), joined)
    assert only_real is not None and "fleet.replicas" in only_real["skipped"]
    only_sim = compare_routing(one, _sim([0, 1, 0, 1]), joined)
    assert only_sim is not None and "backend.data_parallel_size" in only_sim["skipped"]
    assert "only the simulation is a fleet" in routing_markdown(only_sim)
    assert compare_routing(one, _sim([0] * 4).drop(columns=["engine"]), joined) is None
    assert routing_markdown(None) == ""


def test_each_replica_s_prefix_cache_hit_rate_on_each_side() -> None:
    real = _real([0, 1, 0, 1]).assign(cached_tokens=[0, 32, 64, 0])
    sim = _sim([0, 1, 1, 1]).assign(cached_tokens=[0, 32, 64, 32])
    block = compare_routing(real, sim, _joined(4))
    assert block is not None
    zero, one = block["per_replica"]
    prompts = _joined(4).num_prefill_tokens
    assert zero["real_hit_rate"] == pytest.approx(64 / (prompts[0] + prompts[2]))
    assert zero["sim_hit_rate"] == pytest.approx(0.0)
    assert one["sim_hit_rate"] == pytest.approx(128 / prompts[1:].sum())
    gap = max(
        abs(zero["sim_hit_rate"] - zero["real_hit_rate"]),
        abs(one["sim_hit_rate"] - one["real_hit_rate"]),
    )
    assert block["largest_hit_rate_gap_points"] == pytest.approx(100 * gap)
    assert "prefix-cache hit rate real / sim" in routing_markdown(block)
    plain = compare_routing(_real([0, 1, 0, 1]), _sim([0, 1, 0, 1]), _joined(4))
    assert plain is not None and plain["largest_hit_rate_gap_points"] is None
    assert "hit rate" not in routing_markdown(plain)


def test_a_replay_on_the_clients_reads_says_a_request_sent_elsewhere_is_a_defect() -> None:
    real, sim, joined = _real([0, 1, 0, 1]), _sim([0, 1, 0, 1]), _joined(4)
    on_reads = compare_routing(real, sim, joined, {"router_reads": READ_BY_CLIENT})
    assert on_reads is not None and on_reads["router_reads"] == READ_BY_CLIENT
    assert "same code on the same inputs" in routing_markdown(on_reads)
    own = compare_routing(real, sim, joined, {"router_reads": "simulated"})
    assert "same code on the same inputs" not in routing_markdown(own)
