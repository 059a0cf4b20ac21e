"""The bundle schema is Vidur's (the real Vidur mlp.csv validates against it, column for column),
and a bundle damaged by hand is refused naming the file, row and column."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gpu_simulate_test.core.bundle import MLP_TABLE, load_bundle
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, read_csv, read_json, write_json
from tests.conftest import SHARED_FIXTURES
from tests.vidur_bundle_factory import QWEN3_TINY, write_synthetic_bundle

REAL_MLP = SHARED_FIXTURES / "vidur" / "mlp_llama2_7b_a100_head40.csv"


def test_real_vidur_mlp_profile_matches_our_schema() -> None:
    header = pd.read_csv(REAL_MLP, nrows=0).columns.tolist()
    assert header == MLP_TABLE.column_names
    frame = read_csv(REAL_MLP, MLP_TABLE)
    assert len(frame) == 40 and frame["use_gated_mlp"].all()
    assert frame["time_stats.mlp_up_proj.median"].gt(0).all()


def _with_grid(root: Path) -> Path:
    """A synthetic bundle whose meta.json records the grid its rows were made on (as a profiled
    one does)."""
    bundle = write_synthetic_bundle(root)
    mlp = pd.read_csv(bundle / layout.MLP_PROFILE)
    attention = pd.read_csv(bundle / layout.ATTENTION_PROFILE)
    decode = attention[attention["prefill_chunk_size"] == 0]
    prefill = attention[attention["prefill_chunk_size"] > 0]
    meta = read_json(bundle / layout.BUNDLE_META)
    meta["grid"] = {
        "num_tokens": sorted(mlp["num_tokens"].unique().tolist()),
        "batch_sizes": sorted(decode["batch_size"].unique().tolist()),
        "kv_cache_sizes": sorted(decode["kv_cache_size"].unique().tolist()),
        "prefill_chunks": sorted(prefill["prefill_chunk_size"].unique().tolist()),
    }
    write_json(bundle / layout.BUNDLE_META, meta)
    return bundle


def test_a_removed_row_is_named_before_anything_runs(tmp_path: Path) -> None:
    bundle = _with_grid(tmp_path)
    load_bundle(bundle, QWEN3_TINY)  # complete: accepted
    mlp = pd.read_csv(bundle / layout.MLP_PROFILE)
    mlp.drop(index=3).to_csv(bundle / layout.MLP_PROFILE, index=False)
    missing = int(mlp["num_tokens"].iloc[3])
    with pytest.raises(ArtifactError, match=rf"mlp\.csv: no row for num_tokens={missing}, which"):
        load_bundle(bundle, QWEN3_TINY)


def test_a_removed_or_repeated_attention_row_is_named(tmp_path: Path) -> None:
    bundle = _with_grid(tmp_path)
    attention = pd.read_csv(bundle / layout.ATTENTION_PROFILE)
    attention.drop(index=0).to_csv(bundle / layout.ATTENTION_PROFILE, index=False)
    row = attention.iloc[0]
    with pytest.raises(
        ArtifactError,
        match=rf"attention\.csv: no row for batch_size={row['batch_size']}, "
        rf"kv_cache_size={row['kv_cache_size']}, prefill_chunk_size=0",
    ):
        load_bundle(bundle, QWEN3_TINY)
    pd.concat([attention, attention.iloc[[0]]]).to_csv(
        bundle / layout.ATTENTION_PROFILE, index=False
    )
    with pytest.raises(ArtifactError, match=r"attention\.csv: 1 duplicate row"):
        load_bundle(bundle, QWEN3_TINY)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("negative", r"row 3, column 'time_stats\.mlp_up_proj\.median': value -1 is below"),
        ("nan", r"row 3, column 'time_stats\.mlp_up_proj\.median': empty value or NaN"),
        ("renamed", r"missing required column\(s\) time_stats\.mlp_up_proj\.median"),
    ],
)
def test_a_damaged_time_or_column_is_named(tmp_path: Path, change: str, message: str) -> None:
    bundle = _with_grid(tmp_path)
    mlp = pd.read_csv(bundle / layout.MLP_PROFILE)
    column = "time_stats.mlp_up_proj.median"
    if change == "renamed":
        mlp = mlp.rename(columns={column: "time_stats.mlp_up.median"})
    else:
        mlp.loc[2, column] = -1.0 if change == "negative" else float("nan")
    mlp.to_csv(bundle / layout.MLP_PROFILE, index=False)
    with pytest.raises(ArtifactError, match=message):
        load_bundle(bundle, QWEN3_TINY)
