"""The prefix cache in a comparison, on hand-made frames: which column is read, the per-request
agreement, vLLM's hit rate (hits / queries, tokens) and TTFT of hits and misses per clock."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.groups import ttft_by_group, ttft_clocks
from gpu_simulate_test.compare.prefix_cache import (
    compare_prefix_cache,
    compared_hit_rates,
    hit_labels,
    prefix_cache_findings,
    prefix_cache_markdown,
    run_hit_rates,
    side_cached,
    token_agreement,
)

NAN = np.nan


def _side(ttft: list[float]) -> m.SideTimes:
    n = len(ttft)
    return m.SideTimes(
        arrival_time_s=np.arange(n, dtype=float),
        ttft_s=np.asarray(ttft, dtype=float),
        tpot_s=np.full(n, 0.01),
        e2e_s=np.asarray(ttft, dtype=float) + 0.1,
        scheduling_delay_s=np.full(n, NAN),
    )


def _joined(real_ttft: list[float], sim_ttft: list[float]) -> m.JoinedRequests:
    n = len(real_ttft)
    return m.JoinedRequests(
        request_id=np.arange(n, dtype=np.int64),
        num_prefill_tokens=np.full(n, 100, dtype=np.int64),
        num_decode_tokens=np.full(n, 8, dtype=np.int64),
        real=_side(real_ttft),
        sim=_side(sim_ttft),
    )


def test_the_usage_is_read_first_and_the_scheduler_s_record_where_it_is_empty() -> None:
    ids = np.array([2, 0, 1])
    frame = pd.DataFrame(
        {"request_id": [0, 1, 2], "cached_tokens": [NAN] * 3, "engine_cached_tokens": [0, 16, -1]}
    )
    values, column = side_cached(frame, ids, ("cached_tokens", "engine_cached_tokens"))
    assert column == "engine_cached_tokens"
    np.testing.assert_array_equal(values, [NAN, 0, 16])  # by id; -1 (never admitted): none
    frame["cached_tokens"] = [32, NAN, 0]
    values, column = side_cached(frame, ids, ("cached_tokens", "engine_cached_tokens"))
    assert column == "cached_tokens"
    np.testing.assert_array_equal(values, [0, 32, NAN])
    no_column = pd.DataFrame({"request_id": [0, 1, 2]})
    assert side_cached(no_column, ids, ("cached_tokens",)) == (None, None)
    assert side_cached(None, ids, ("cached_tokens",)) == (None, None)


def test_per_request_agreement_counts_lists_and_measures_the_differences() -> None:
    ids = np.array([10, 11, 12, 13, 14, 15])
    real = np.array([0, 16, 32, NAN, 48, 64])
    sim = np.array([0, 32, 32, 16, 16, 64])
    agree = token_agreement(ids, real, sim, listed=1)
    assert agree["requests"] == 5  # 13 has no real hit recorded
    assert agree["identical_fraction"] == pytest.approx(3 / 5)
    assert agree["mean_abs_diff_tokens"] == pytest.approx((16 + 32) / 5)
    assert agree["max_abs_diff_tokens"] == 32
    assert agree["differing"] == 2
    assert agree["first_differing"] == [{"request_id": 11, "real": 16, "sim": 32}]


def test_hit_rates_are_hits_over_queries_in_tokens_with_the_difference_in_points() -> None:
    real_log: dict[str, float] = {"prefix_cache_hit_tokens": 300, "prefix_cache_query_tokens": 1000}
    real_meta = {"engine_log": real_log}
    sim_meta = {"prefix_cache": {"queries": 1000, "hits": 352, "preempted_queries": 0,
                                 "preempted_hits": 0, "hit_rate": 0.352}}  # fmt: skip
    rates = run_hit_rates(real_meta, sim_meta)
    assert rates["real"] == pytest.approx(0.30)  # no recorded rate: from the tokens
    assert rates["sim"] == pytest.approx(0.352)
    assert rates["difference_points"] == pytest.approx(5.2)
    assert rates["real_tokens"] == {"hits": 300, "queries": 1000}
    real_log["prefix_cache_hit_rate"] = 0.25  # the engine's own: used as it is
    assert run_hit_rates(real_meta, sim_meta)["real"] == pytest.approx(0.25)
    nothing = run_hit_rates({}, {"prefix_cache": None})
    assert nothing["real"] is None and nothing["sim"] is None
    assert nothing["difference_points"] is None
    # over the compared requests: only where both sides recorded a hit
    compared = compared_hit_rates(
        np.array([0.0, 50, 100, NAN]), np.array([0.0, 100, 100, 50]), np.array([100, 200, 100, 50])
    )
    assert compared["queries"] == 400
    assert compared["real"] == pytest.approx(150 / 400)
    assert compared["sim"] == pytest.approx(200 / 400)
    assert compared["difference_points"] == pytest.approx(12.5)


def test_hits_and_misses_are_split_by_the_real_side_on_both_clocks() -> None:
    joined = _joined([0.1, 0.2, 0.3, 0.4, 0.5], [0.1, 0.1, 0.3, 0.2, 0.5])
    real = pd.DataFrame(
        {
            "request_id": [4, 3, 2, 1, 0],  # any order: by id
            "engine_ttft_s": [0.25, 0.2, 0.15, 0.1, 0.05],
            "cached_tokens": [0, 64, NAN, 16, 0],
        }
    )
    sim = pd.DataFrame({"request_id": range(5), "frontend_delay_s": [0.0, 0.05, 0, 0, 0]})
    clocks = ttft_clocks(real, sim, joined)
    assert [c.clock for c in clocks] == ["engine", "client"]
    cached, _ = side_cached(real, joined.request_id, ("cached_tokens",))
    assert cached is not None
    labels = hit_labels(cached)
    assert labels.tolist() == ["miss", "hit", "", "hit", "miss"]
    rows = {(r["clock"], r["group"]): r for r in ttft_by_group(labels, ("hit", "miss"), clocks)}
    hit = rows["client", "hit"]  # requests 1 and 3: real 0.2, 0.4; simulated 0.1, 0.2
    assert hit["requests"] == 2
    assert hit["real_p50_s"] == pytest.approx(0.3) and hit["sim_p50_s"] == pytest.approx(0.15)
    assert hit["error_p50"] == pytest.approx(-0.5)
    assert hit["real_p90_s"] == pytest.approx(0.38)
    engine = rows["engine", "hit"]  # engine: 0.2, 0.1; simulated without its front end
    assert engine["real_p50_s"] == pytest.approx(0.15)
    assert engine["sim_p50_s"] == pytest.approx((0.05 + 0.2) / 2)
    assert rows["client", "miss"]["requests"] == 2
    # no engine clock: the client's alone
    assert [c.clock for c in ttft_clocks(real.drop(columns="engine_ttft_s"), sim, joined)] == [
        "client"
    ]


def test_one_side_alone_is_named_and_nothing_is_compared() -> None:
    joined = _joined([0.1, 0.2], [0.1, 0.2])
    clocks = ttft_clocks(pd.DataFrame({"request_id": [0, 1]}), None, joined)
    cached = pd.DataFrame({"request_id": [0, 1], "cached_tokens": [0, 32]})
    empty = pd.DataFrame({"request_id": [0, 1], "cached_tokens": [NAN, NAN]})
    real_meta = {"engine_log": {"prefix_cache_hit_rate": 0.16}}

    block = compare_prefix_cache(cached, empty, joined, clocks, real_meta, {})
    assert block is not None and block["only"] == "real"
    assert "per_request" not in block and "ttft_by_hit" not in block
    assert block["run_hit_rate"]["real"] == pytest.approx(0.16)
    text = prefix_cache_markdown(block)
    assert "## Prefix cache" in text and "Only the real run has per-request cached tokens" in text
    assert prefix_cache_findings(block) == [
        "per-request prefix-cache hits only in the real run: nothing of the cache compared"
    ]

    block = compare_prefix_cache(empty, cached, joined, clocks, {}, {})
    assert block is not None and block["only"] == "sim"
    assert "Only the simulation has per-request cached tokens" in prefix_cache_markdown(block)

    assert compare_prefix_cache(empty, empty, joined, clocks, real_meta, {}) is None
    assert prefix_cache_markdown(None) == "" and prefix_cache_findings(None) == []


def test_both_sides_give_every_part_of_the_block_and_the_section() -> None:
    joined = _joined([0.1, 0.2, 0.3], [0.1, 0.2, 0.3])
    clocks = ttft_clocks(pd.DataFrame({"request_id": [0, 1, 2]}), None, joined)
    real = pd.DataFrame({"request_id": [0, 1, 2], "engine_cached_tokens": [0, 32, 48]})
    sim = pd.DataFrame({"request_id": [0, 1, 2], "cached_tokens": [0, 32, 32]})
    block = compare_prefix_cache(real, sim, joined, clocks, {}, {})
    assert block is not None and block["only"] is None
    assert block["real_source"] == "engine_cached_tokens"
    assert block["per_request"]["differing"] == 1
    assert block["compared_hit_rate"]["difference_points"] == pytest.approx(-16 / 300 * 100)
    assert [(r["clock"], r["group"], r["requests"]) for r in block["ttft_by_hit"]] == [
        ("client", "hit", 2),
        ("client", "miss", 1),
    ]
    text = prefix_cache_markdown(block)
    assert "real: its scheduler's record" in text
    assert "| whole run (run_meta.json) | – | – | – |" in text
    assert "| compared requests (300 prompt tokens) | 26.7% | 21.3% | -5.3 points |" in text
    assert "first differing (real vs simulated): 2 (48 vs 32)." in text
    assert "| client | hit | 2 | 250.00 | 250.00 | +0.0% |" in text


def test_a_real_run_with_the_cache_off_has_no_cached_tokens_to_compare() -> None:
    """With caching off the scheduler still records each admission's hit, always 0: the main
    job (cache off on both sides) gets no prefix-cache section, not a one-sided one."""
    joined = _joined([0.1, 0.2], [0.1, 0.2])
    clocks = ttft_clocks(pd.DataFrame({"request_id": [0, 1]}), None, joined)
    zeros = pd.DataFrame({"request_id": [0, 1], "engine_cached_tokens": [0, 0]})
    empty = pd.DataFrame({"request_id": [0, 1]})
    off = {"config": {"backend": {"enable_prefix_caching": False}}}
    assert compare_prefix_cache(zeros, empty, joined, clocks, off, {}) is None
    on = {"config": {"backend": {"enable_prefix_caching": True}}}
    block = compare_prefix_cache(zeros, empty, joined, clocks, on, {})
    assert block is not None and block["only"] == "real"
