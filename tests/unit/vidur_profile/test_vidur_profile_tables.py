"""The profiler writes Vidur's formats from the real Qwen3 modules; bundles land atomically."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest

from gpu_simulate_test.config.schema import ConfigError, ModelConfig
from gpu_simulate_test.core.profiling.bundle import ATTENTION_TABLE, MLP_OPS, MLP_TABLE
from gpu_simulate_test.core.profiling.grid import ProfileGrid
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json, write_csv
from gpu_simulate_test.vidur_profile import bundle_writer
from gpu_simulate_test.vidur_profile.bundle_writer import BundleExistsError, write_bundle
from gpu_simulate_test.vidur_profile.layer_ops import (
    OP_DEFINITIONS,
    _causal_mask,
    build_layer,
    check_attn_implementation,
    token_ops,
)
from gpu_simulate_test.vidur_profile.profiler import ProfileTables, profile_tables
from gpu_simulate_test.vidur_profile.timing import TimingPolicy
from tests.conftest import SHARED_FIXTURES

VIDUR_MLP_FIXTURE = SHARED_FIXTURES / "vidur" / "mlp_llama2_7b_a100_head40.csv"
SMALL = ModelConfig(
    name="small",
    num_layers=1,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=1000,
    max_position_embeddings=512,
)
GRID = ProfileGrid(
    num_tokens=(1, 3), batch_sizes=(1, 2), prefill_chunks=(4,), kv_cache_sizes=(0, 8)
)
ONCE = TimingPolicy(warmup=0, repeats=1, min_repeats=1)


@pytest.fixture(scope="module")
def layer():
    import torch

    return build_layer(SMALL, "cpu", torch.float32)


@pytest.fixture(scope="module")
def tables(layer) -> ProfileTables:
    return profile_tables(layer, GRID, block_size=16, policy=ONCE)


def test_mlp_header_equals_a_real_vidur_profile(tables: ProfileTables, tmp_path: Path) -> None:
    path = write_csv(tmp_path / "mlp.csv", tables.mlp, MLP_TABLE)
    ours = path.read_text().splitlines()[0].split(",")
    theirs = VIDUR_MLP_FIXTURE.read_text().splitlines()[0].split(",")
    assert ours == theirs
    assert list(tables.mlp["num_tokens"]) == [1, 3]
    row = tables.mlp.iloc[0]
    assert (row["n_head"], row["n_kv_head"], row["n_embd"], row["n_expanded_embd"]) == (
        4,
        2,
        64,
        128,
    )
    assert row["num_tensor_parallel_workers"] == 1 and bool(row["use_gated_mlp"])
    times = tables.mlp[[f"time_stats.{op}.median" for op in MLP_OPS]]
    assert (times > 0).all().all()


def test_attention_rows_follow_vidur_conventions(tables: ProfileTables, tmp_path: Path) -> None:
    write_csv(tmp_path / "attention.csv", tables.attention, ATTENTION_TABLE)
    frame = read_csv(tmp_path / "attention.csv", ATTENTION_TABLE)
    assert list(frame.columns) == ATTENTION_TABLE.column_names
    decode = frame[frame["prefill_chunk_size"] == 0]
    prefill = frame[frame["prefill_chunk_size"] > 0]
    assert sorted(zip(decode["batch_size"], decode["kv_cache_size"], strict=True)) == [
        (1, 0),
        (1, 8),
        (2, 0),
        (2, 8),
    ]
    assert set(prefill["batch_size"]) == {1} and sorted(prefill["kv_cache_size"]) == [0, 8]
    assert decode["time_stats.attn_prefill.median"].isna().all()
    assert prefill["time_stats.attn_decode.median"].isna().all()
    assert (decode["time_stats.attn.median"] == decode["time_stats.attn_decode.median"]).all()
    assert (prefill["time_stats.attn.median"] == prefill["time_stats.attn_prefill.median"]).all()
    assert (frame["time_stats.attn_kv_cache_save.median"] > 0).all()
    assert (frame["block_size"] == 16).all() and (frame["n_q_head"] == 4).all()


def test_rope_op_folds_in_qwen3_qk_norm(layer) -> None:
    import torch

    ops = token_ops(layer, 5)
    assert set(ops) == set(MLP_OPS) and set(MLP_OPS) <= set(OP_DEFINITIONS)
    assert "q_norm" in OP_DEFINITIONS["attn_rope"]
    calls: list[str] = []
    hooks = [
        getattr(layer.attn, name).register_forward_hook(lambda *_a, n=name: calls.append(n))
        for name in ("q_norm", "k_norm")
    ]
    try:
        with torch.inference_mode():
            query, key = ops["attn_rope"]()
    finally:
        for hook in hooks:
            hook.remove()
    assert calls == ["q_norm", "k_norm"]
    assert tuple(query.shape) == (1, 4, 5, 16) and tuple(key.shape) == (1, 2, 5, 16)


def test_causal_mask_lets_chunk_token_i_see_the_past_and_itself(layer) -> None:
    mask = _causal_mask(layer, chunk=3, past=2)
    assert tuple(mask.shape) == (1, 1, 3, 5)
    assert mask[0, 0].int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


def test_sdpa_and_eager_masks_give_the_same_attention(layer) -> None:
    import torch

    eager = build_layer(SMALL, "cpu", torch.float32, "eager")
    generator = torch.Generator().manual_seed(1)
    query = torch.randn(1, 4, 3, 16, generator=generator)
    key, value = (torch.randn(1, 2, 7, 16, generator=generator) for _ in range(2))
    outputs = [
        q.attention_fn(q.attn, query, key, value, _causal_mask(q, 3, 4), scaling=q.attn.scaling)[0]
        for q in (layer, eager)
    ]
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)
    # the last query sees every key: its output differs from a mask that hides the last key
    hidden = _causal_mask(layer, 3, 3)
    short = layer.attention_fn(layer.attn, query, key[:, :, :6], value[:, :, :6], hidden)[0]
    assert not torch.allclose(outputs[0][:, -1], short[:, -1])


def test_unsupported_attention_implementation_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"flash_attention_2.*sdpa, eager"):
        check_attn_implementation("flash_attention_2")


def test_bundle_is_written_atomically_and_not_replaced_silently(
    tables: ProfileTables, tmp_path: Path
) -> None:
    bundle = tmp_path / "profiles" / "cpu" / "small"
    write_bundle(bundle, tables, {"run_id": "first"}, overwrite=False)
    assert {p.name for p in bundle.iterdir()} == {
        layout.MLP_PROFILE,
        layout.ATTENTION_PROFILE,
        layout.BUNDLE_META,
    }
    before = (bundle / layout.MLP_PROFILE).read_bytes()
    with pytest.raises(BundleExistsError, match=r"output\.overwrite=true"):
        write_bundle(bundle, tables, {"run_id": "second"}, overwrite=False)
    assert (bundle / layout.MLP_PROFILE).read_bytes() == before
    assert read_json(bundle / layout.BUNDLE_META)["run_id"] == "first"
    smaller = ProfileTables(tables.mlp.iloc[:1], tables.attention)
    write_bundle(bundle, smaller, {"run_id": "third"}, overwrite=True)
    assert read_json(bundle / layout.BUNDLE_META)["run_id"] == "third"
    assert len(pd.read_csv(bundle / layout.MLP_PROFILE)) == 1
    # no staging or old directories left beside the bundle
    assert [p.name for p in bundle.parent.iterdir()] == ["small"]


def test_a_bad_table_leaves_no_bundle(tables: ProfileTables, tmp_path: Path) -> None:
    bundle = tmp_path / "cpu" / "small"
    broken = ProfileTables(tables.mlp.drop(columns=["num_tokens"]), tables.attention)
    with pytest.raises(ValueError, match="num_tokens"):
        write_bundle(bundle, broken, {}, overwrite=False)
    assert not bundle.exists() and list(bundle.parent.iterdir()) == []
    assert not math.isnan(float(tables.mlp["time_stats.add.median"].iloc[0]))


def test_a_bundle_replaced_and_stopped_between_its_renames_is_the_old_one(
    tables: ProfileTables, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundle = tmp_path / "cpu" / "small"
    write_bundle(bundle, tables, {"run_id": "first"}, overwrite=False)
    real_replace = bundle_writer.os.replace

    def stopped(src: Path, dst: Path) -> None:
        if Path(src).name.endswith(".part") and Path(dst) == bundle:  # Ctrl-C just before it
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(bundle_writer.os, "replace", stopped)
    with pytest.raises(KeyboardInterrupt):
        write_bundle(bundle, tables, {"run_id": "second"}, overwrite=True)
    monkeypatch.undo()
    assert read_json(bundle / layout.BUNDLE_META)["run_id"] == "first"
    assert [p.name for p in bundle.parent.iterdir()] == ["small"]
