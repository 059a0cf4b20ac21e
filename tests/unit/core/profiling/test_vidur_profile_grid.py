"""The profile grid covers the small values and the maxima Vidur will ask for."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from gpu_simulate_test.config.schema import ConfigError, ModelConfig
from gpu_simulate_test.config.vidur import ProfileRangesConfig
from gpu_simulate_test.core.profiling.grid import (
    AUTO_NUM_POINTS,
    Ranges,
    WorkloadExtent,
    axis,
    build_grid,
    resolve_ranges,
)

TINY = ModelConfig(
    name="tiny",
    num_layers=2,
    hidden_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=384,
    vocab_size=1000,
    max_position_embeddings=4096,
)


def test_axis_holds_small_values_both_ends_and_is_sorted() -> None:
    values = axis(4096, 16, small=(1, 2, 3, 5000))
    assert values[:3] == (1, 2, 3) and values[-1] == 4096
    assert 5000 not in values
    assert list(values) == sorted(set(values))
    # geometric: 16 points from 1 to 4096 step by 4096 ** (1 / 15) = 1.74 at most
    ratios = [b / a for a, b in itertools.pairwise(values)]
    assert max(ratios) <= 2.0  # the small values (1 → 2) set the largest step


def test_axis_with_minimum_zero_and_tiny_maximum() -> None:
    assert axis(16, 4, small=(0, 1, 16, 64), minimum=0, geometric_from=16)[0] == 0
    assert axis(1, 8) == (1,)
    with pytest.raises(ValueError, match="below its minimum"):
        axis(0, 4)


@pytest.mark.parametrize("num_points", [2, 8, 16])
def test_default_ranges_grid_covers_every_axis(num_points: int) -> None:
    grid = build_grid(Ranges(4096, 32, 1024, 40960, num_points))
    assert grid.num_tokens[:8] == (1, 2, 3, 4, 5, 6, 7, 8) and grid.num_tokens[-1] == 4096
    assert grid.batch_sizes[:4] == (1, 2, 3, 4) and grid.batch_sizes[-1] == 32
    assert grid.prefill_chunks[-1] == 1024 and 32 in grid.prefill_chunks
    assert grid.kv_cache_sizes[0] == 0 and grid.kv_cache_sizes[-1] == 40960
    assert 64 in grid.kv_cache_sizes
    assert len(grid.decode_shapes) == len(grid.batch_sizes) * len(grid.kv_cache_sizes)
    assert (32, 40960) in grid.decode_shapes and (1024, 40960) in grid.prefill_shapes
    assert grid.num_shapes == (
        len(grid.num_tokens) + len(grid.decode_shapes) + len(grid.prefill_shapes)
    )


def test_more_points_means_a_denser_grid() -> None:
    coarse = build_grid(Ranges(4096, 32, 1024, 4096, 8))
    dense = build_grid(Ranges(4096, 32, 1024, 4096, 16))
    assert len(dense.kv_cache_sizes) > len(coarse.kv_cache_sizes)
    assert len(dense.num_tokens) > len(coarse.num_tokens)


def test_resolve_ranges_defaults_to_model_context_and_device_points() -> None:
    cfg = ProfileRangesConfig()
    cpu = resolve_ranges(cfg, TINY, "cpu")
    assert cpu.max_kv_cache_size == TINY.max_position_embeddings
    assert cpu.num_points == AUTO_NUM_POINTS["cpu"]
    assert resolve_ranges(cfg, TINY, "cuda:0").num_points == AUTO_NUM_POINTS["cuda"]
    assert resolve_ranges(replace(cfg, num_points=5), TINY, "cuda").num_points == 5


def test_workload_widens_ranges_but_never_narrows() -> None:
    cfg = ProfileRangesConfig(max_num_tokens=64, max_prefill_chunk=32, max_kv_cache_size=128)
    wide = resolve_ranges(cfg, TINY, "cpu", WorkloadExtent("wl-x", 700, 1500))
    assert (wide.max_num_tokens, wide.max_prefill_chunk, wide.max_kv_cache_size) == (
        700,
        700,
        1500,
    )
    small = resolve_ranges(cfg, TINY, "cpu", WorkloadExtent("wl-y", 10, 20))
    assert (small.max_num_tokens, small.max_prefill_chunk, small.max_kv_cache_size) == (64, 32, 128)


def test_kv_range_beyond_model_context_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"max_kv_cache_size=5000 is beyond model tiny"):
        resolve_ranges(ProfileRangesConfig(max_kv_cache_size=5000), TINY, "cpu")


def test_a_workload_beyond_the_model_context_is_named() -> None:
    # it read "profile.max_kv_cache_size=5045 is beyond ...": a knob the user never set
    extent = WorkloadExtent("wl-z", 5000, 5045, "tmp/workload/z")
    with pytest.raises(
        ConfigError, match=r"tmp/workload/z \(wl-z\): its longest request has 5045 tokens"
    ):
        resolve_ranges(ProfileRangesConfig(), TINY, "cpu", extent)
