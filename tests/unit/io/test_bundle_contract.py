"""The bundle schema is Vidur's (the real Vidur mlp.csv validates against it, column for column),
and a bundle damaged by hand is refused naming the file, row and column."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gpu_simulate_test.config.vidur import VidurSimulateStageConfig
from gpu_simulate_test.core.profiling.bundle import MLP_TABLE, STATS, load_bundle
from gpu_simulate_test.core.profiling.bundle_checks import profile_warnings
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, read_csv, read_json, write_json
from tests.conftest import SHARED_FIXTURES
from tests.vidur_bundle_factory import CPU, QWEN3_TINY, write_synthetic_bundle, write_workload_run

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


def plant_outlier(
    bundle: Path, op: str = "mlp_up_proj", row: int = 3, factor: float = 500.0
) -> int:
    """Multiply every time of ``op`` in one row of the bundle's ``mlp.csv`` by ``factor``, as a
    stray edit or a damaged copy would; returns that row's ``num_tokens``."""
    mlp = pd.read_csv(bundle / layout.MLP_PROFILE)
    for stat in STATS:
        column = f"time_stats.{op}.{stat}"
        times = mlp[column].to_numpy(dtype=float, copy=True)
        times[row] *= factor
        mlp[column] = times
    mlp.to_csv(bundle / layout.MLP_PROFILE, index=False)
    return int(mlp["num_tokens"].to_numpy()[row])


def test_a_planted_outlier_is_refused_on_every_load_for_simulation(tmp_path: Path) -> None:
    bundle = write_synthetic_bundle(tmp_path / "profiles", QWEN3_TINY, points=6)
    load_bundle(bundle, QWEN3_TINY)  # clean: accepted
    tokens = plant_outlier(bundle)
    named = rf"{bundle}/mlp\.csv: mlp_up_proj takes [0-9.]+ ms at num_tokens={tokens} but"
    with pytest.raises(ArtifactError, match=named):
        load_bundle(bundle, QWEN3_TINY)
    # the simulator's own load: refused before anything is simulated
    from gpu_simulate_test.vidur_simulate.stage import prepare

    workload = write_workload_run(tmp_path, "w", [16] * 4, [4] * 4, [0.0, 0.1, 0.2, 0.3])
    cfg = VidurSimulateStageConfig(
        model=QWEN3_TINY,
        hardware=CPU,
        workload_dir=str(workload),
        profiling_root=str(tmp_path / "profiles"),
        progress=False,
    )
    with pytest.raises(ArtifactError, match=named):
        prepare(cfg)
    # a reader after what the bundle covers, not its timings, still reads it
    assert load_bundle(bundle, timings_checked=False).ranges.block_size == 16


def test_findings_the_profiler_recorded_are_left_to_accept_profile_warnings(
    tmp_path: Path,
) -> None:
    """A disturbed profile records its findings in meta.json; loading it is the pipeline's call
    (``accept_profile_warnings``), and any finding beyond those is refused."""
    bundle = write_synthetic_bundle(tmp_path, QWEN3_TINY, points=6)
    plant_outlier(bundle)
    mlp = pd.read_csv(bundle / layout.MLP_PROFILE)
    attention = pd.read_csv(bundle / layout.ATTENTION_PROFILE)
    meta = read_json(bundle / layout.BUNDLE_META)
    meta["quality_warnings"] = profile_warnings(mlp, attention, ["mlp_up_proj"])
    assert len(meta["quality_warnings"]) == 1
    write_json(bundle / layout.BUNDLE_META, meta)
    load_bundle(bundle, QWEN3_TINY)
    plant_outlier(bundle, op="mlp_down_proj", row=2)
    with pytest.raises(ArtifactError, match=r"1 timing finding.*mlp_down_proj takes"):
        load_bundle(bundle, QWEN3_TINY)


@pytest.mark.parametrize(("key", "value"), [("model", "qwen"), ("engine_calibration", [1, 2])])
def test_a_meta_key_that_is_not_an_object_is_named(tmp_path: Path, key: str, value: object) -> None:
    # read as an object, a string 'model' failed with AttributeError: 'str' object has no
    # attribute 'get' (vidur_simulate and vidur_profile output.overwrite=true alike)
    bundle = _with_grid(tmp_path)
    meta = read_json(bundle / layout.BUNDLE_META)
    meta[key] = value
    write_json(bundle / layout.BUNDLE_META, meta)
    with pytest.raises(ArtifactError, match=rf"meta\.json: '{key}' is an? \w+, expected a JSON"):
        load_bundle(bundle, QWEN3_TINY)
