"""The disturbed-profile check: an op far slower on a smaller shape than on a larger one."""

from __future__ import annotations

import pandas as pd

from gpu_simulate_test.vidur_profile.profile_checks import inversions, profile_warnings, slow_sizes
from gpu_simulate_test.vidur_profile.stage import _keep_fastest

SIZES = [1, 2, 4, 8, 16, 32, 64, 128]


def mlp(times: list[float], other: list[float] | None = None) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "num_tokens": SIZES,
            "time_stats.mlp_up_proj.median": times,
            "time_stats.mlp_down_proj.median": other or [0.1 * (i + 1) for i in range(8)],
        }
    )


def test_a_growing_or_noisy_profile_is_not_reported() -> None:
    # flat and noisy on small shapes (up to 3x), then growing: what a quiet machine gives
    times = [0.05, 0.15, 0.06, 0.08, 0.1, 0.2, 0.4, 0.8]
    assert inversions(mlp(times), "num_tokens", ["mlp_up_proj", "mlp_down_proj"], "mlp.csv") == []


def test_a_busy_stretch_is_reported_with_its_worst_pair() -> None:
    # timed while another job held the cores: 2..16 tokens at 30-48 ms, 32 tokens at 0.2 ms
    times = [0.05, 30.0, 48.0, 44.0, 40.0, 0.2, 0.4, 0.8]
    found = inversions(mlp(times), "num_tokens", ["mlp_up_proj", "mlp_down_proj"], "mlp.csv")
    assert found == [
        "mlp.csv: mlp_up_proj takes 48 ms at num_tokens=4 but 0.2 ms at 32 (240x; 4 size(s) "
        "affected)"
    ]


def test_microsecond_differences_are_timer_noise() -> None:
    times = [0.001, 0.04, 0.002, 0.002, 0.003, 0.003, 0.004, 0.005]  # 20x, but 0.04 ms
    assert inversions(mlp(times), "num_tokens", ["mlp_up_proj"], "mlp.csv") == []


def test_attention_is_checked_per_kv_size() -> None:
    rows = []
    for kv in (0, 64):
        for batch in (1, 2, 4):
            slow = kv == 64 and batch == 2
            rows.append(
                {
                    "batch_size": batch,
                    "kv_cache_size": kv,
                    "prefill_chunk_size": 0,
                    "time_stats.attn_decode.median": 8.0 if slow else 0.02 * batch,
                    "time_stats.attn_prefill.median": 0.0,
                }
            )
        for chunk in (16, 64):
            rows.append(
                {
                    "batch_size": 1,
                    "kv_cache_size": kv,
                    "prefill_chunk_size": chunk,
                    "time_stats.attn_decode.median": 0.0,
                    "time_stats.attn_prefill.median": 0.01 * chunk,
                }
            )
    found = profile_warnings(mlp([0.1 * (i + 1) for i in range(8)]), pd.DataFrame(rows), [])
    assert found == [
        "attention.csv: attn_decode (kv_cache_size=64) takes 8 ms at batch_size=2 but 0.08 ms "
        "at 4 (100x; 1 size(s) affected)"
    ]


def test_slow_sizes_are_the_smaller_shapes_of_each_inverted_pair() -> None:
    times = [0.05, 30.0, 48.0, 44.0, 40.0, 0.2, 0.4, 0.8]
    assert slow_sizes(mlp(times), "num_tokens", ["mlp_up_proj", "mlp_down_proj"]) == {
        (2,),
        (4,),
        (8,),
        (16,),
    }
    assert slow_sizes(mlp([0.1 * s for s in SIZES]), "num_tokens", ["mlp_up_proj"]) == set()


def test_the_fastest_look_at_each_op_is_kept() -> None:
    disturbed = mlp([0.05, 30.0, 48.0, 0.1, 0.12, 0.2, 0.4, 0.8])
    again = disturbed.iloc[[1, 2]].copy()
    again["time_stats.mlp_up_proj.median"] = [0.06, 60.0]  # 2 tokens now clean, 4 still busy
    again["time_stats.mlp_down_proj.median"] = [9.0, 0.0]  # slower: not taken; faster: taken
    kept = _keep_fastest(disturbed, again, ["num_tokens"])
    assert kept["time_stats.mlp_up_proj.median"].tolist()[:4] == [0.05, 0.06, 48.0, 0.1]
    assert kept["time_stats.mlp_down_proj.median"].tolist()[1:3] == [0.2, 0.0]
    assert disturbed["time_stats.mlp_up_proj.median"].iloc[1] == 30.0  # the input is untouched
