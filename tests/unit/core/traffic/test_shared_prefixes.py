"""Shared prefixes of a synthetic workload: the draw, the share and what they leave unchanged."""

from __future__ import annotations

import numpy as np

from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import PrefixConfig, WorkloadStageConfig
from gpu_simulate_test.core.traffic.prefixes import draw_prefixes
from gpu_simulate_test.core.traffic.workloads import generate


def test_prefixes_off_by_default() -> None:
    assert draw_prefixes(PrefixConfig(), seed=0, num_requests=10) is None


def test_same_seed_same_draw_other_seed_other_draw() -> None:
    cfg = PrefixConfig(num_prefixes=5)
    a, b, c = (draw_prefixes(cfg, seed, 200) for seed in (1, 1, 2))
    assert a is not None and b is not None and c is not None
    assert np.array_equal(a.prefix_id, b.prefix_id)
    assert np.array_equal(a.token_ids(1000)[3], b.token_ids(1000)[3])
    assert not np.array_equal(a.prefix_id, c.prefix_id)
    assert not np.array_equal(a.token_ids(1000)[0], c.token_ids(1000)[0])


def test_zipf_share_skews_toward_prefix_0_and_uniform_does_not() -> None:
    zipf = draw_prefixes(PrefixConfig(num_prefixes=4, share="zipf", zipf_a=1.0), 0, 4000)
    uniform = draw_prefixes(PrefixConfig(num_prefixes=4), 0, 4000)
    assert zipf is not None and uniform is not None
    shares = np.asarray(zipf.requests_per_prefix()) / 4000
    expected = 1 / np.arange(1, 5)
    assert np.allclose(shares, expected / expected.sum(), atol=0.03)  # 0.48, 0.24, 0.16, 0.12
    assert np.allclose(np.asarray(uniform.requests_per_prefix()) / 4000, 0.25, atol=0.03)


def test_prefix_lengths_follow_their_distribution() -> None:
    cfg = PrefixConfig(num_prefixes=6)
    drawn = draw_prefixes(cfg, 0, 30)
    assert drawn is not None and drawn.prefix_lengths.tolist() == [64] * 6
    assert [len(ids) for ids in drawn.token_ids(151936)] == [64] * 6
    assert np.array_equal(drawn.request_prefix_len, drawn.prefix_lengths[drawn.prefix_id])


def test_prefixes_add_to_the_own_tokens_and_leave_the_other_draws(compose_stage) -> None:
    def typed(overrides: list[str]) -> WorkloadStageConfig:
        return to_typed(compose_stage("workload", overrides), WorkloadStageConfig)

    plain = typed(["workload=shared_prefix", "workload.prefix.num_prefixes=0"])
    shared = typed(["workload=shared_prefix"])
    without, _ = generate(plain.workload, plain.model)
    with_prefixes, _ = generate(shared.workload, shared.model)
    assert without.prefixes is None and with_prefixes.prefixes is not None
    own = with_prefixes.num_prefill_tokens - with_prefixes.prefixes.request_prefix_len
    assert np.array_equal(own, without.num_prefill_tokens)
    assert np.array_equal(with_prefixes.num_decode_tokens, without.num_decode_tokens)
    assert np.array_equal(with_prefixes.arrival_time_s, without.arrival_time_s)
    assert with_prefixes.fingerprint() != without.fingerprint()
