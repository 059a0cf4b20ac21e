"""The local random-forest predictor: trains on the bundle, caches by fingerprint, never the hub."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpu_simulate_test.config.schema import HardwareConfig, ModelConfig
from gpu_simulate_test.config.vidur import VidurPredictorConfig
from gpu_simulate_test.core.profiling.bundle import Bundle, load_bundle
from gpu_simulate_test.vidur_simulate.predictor import (
    fingerprint,
    predictor_config,
    predictor_settings,
)
from gpu_simulate_test.vidur_simulate.registration import register_vidur_extensions
from tests.vidur_bundle_factory import QWEN3_TINY, SyntheticRanges, write_synthetic_bundle

vidur_config = pytest.importorskip("vidur.config")

CPU = HardwareConfig(
    name="cpu", device="cpu", peak_bf16_tflops=1.0, memory_bandwidth_gb_s=20.0, memory_gib=24.0
)
RANGES = SyntheticRanges(max_num_tokens=512, max_batch_size=8, max_prefill_chunk=256)
BOUNDS = {
    "prediction_max_tokens_per_request": 512,
    "prediction_max_prefill_chunk_size": 256,
    "prediction_max_batch_size": 8,
}
SETTINGS = VidurPredictorConfig(num_estimators=8, max_depth=8, num_training_job_threads=1)


def make_predictor(bundle: Bundle, settings: VidurPredictorConfig, model: ModelConfig) -> Any:
    from vidur.execution_time_predictor import ExecutionTimePredictorRegistry

    name, device = register_vidur_extensions(model, CPU)
    replica = vidur_config.ReplicaConfig(
        model_name=name,
        num_pipeline_stages=1,
        tensor_parallel_size=1,
        device=device.device,
        network_device=device.network_device,
    )
    config = predictor_config(bundle, model, settings, BOUNDS, block_size=16)
    return ExecutionTimePredictorRegistry.get(
        config.get_type(),
        predictor_config=config,
        replica_config=replica,
        cache_config=vidur_config.CacheConfig(block_size=16),
    )


@pytest.fixture
def bundle(tmp_path: Path) -> Bundle:
    return load_bundle(write_synthetic_bundle(tmp_path / "profiles", ranges=RANGES, points=8))


def test_fingerprint_depends_on_bytes_model_and_settings(bundle: Bundle) -> None:
    files = [bundle.mlp_path, bundle.attention_path]
    settings = predictor_settings(SETTINGS, BOUNDS, 16)
    base = fingerprint(files, QWEN3_TINY, settings)
    assert fingerprint(files, QWEN3_TINY, settings) == base
    assert fingerprint(files, replace(QWEN3_TINY, num_layers=3), settings) != base
    other = predictor_settings(replace(SETTINGS, num_estimators=9), BOUNDS, 16)
    assert fingerprint(files, QWEN3_TINY, other) != base
    assert fingerprint(files, QWEN3_TINY, {**settings, "block_size": 32}) != base


def test_one_changed_csv_value_changes_fingerprint_and_predictions(
    bundle: Bundle, tmp_path: Path
) -> None:
    settings = replace(SETTINGS, cache_dir=str(tmp_path / "cache"))
    first = make_predictor(bundle, settings, QWEN3_TINY)
    assert not first.cache_hit

    # slow down mlp_up_proj for 128..512 tokens 10x: a different profile, same shape
    mlp = pd.read_csv(bundle.mlp_path)
    slow = mlp["num_tokens"] >= 128
    mlp.loc[slow, "time_stats.mlp_up_proj.median"] *= 10
    mlp.to_csv(bundle.mlp_path, index=False)
    changed = load_bundle(bundle.path)
    second = make_predictor(changed, settings, QWEN3_TINY)
    assert not second.cache_hit
    assert second._config.fingerprint != first._config.fingerprint
    assert second._config.cache_dir != first._config.cache_dir
    assert (
        second._predictions["mlp_up_proj"][(256,)] > 5 * first._predictions["mlp_up_proj"][(256,)]
    )
    assert second._predictions["attn_decode"] == first._predictions["attn_decode"]

    # the same bundle again: every table from the cache, equal to the trained ones
    again = make_predictor(changed, settings, QWEN3_TINY)
    assert again.cache_hit and again._config.fingerprint == second._config.fingerprint
    for op, table in second._predictions.items():
        assert again._predictions[op].keys() == table.keys(), op
        assert all(abs(again._predictions[op][k] - v) < 1e-9 for k, v in table.items()), op


def test_no_cache_retrains(bundle: Bundle, tmp_path: Path) -> None:
    settings = replace(SETTINGS, cache_dir=str(tmp_path / "cache"))
    make_predictor(bundle, settings, QWEN3_TINY)
    assert not make_predictor(bundle, replace(settings, no_cache=True), QWEN3_TINY).cache_hit


def test_never_touches_the_hub(
    bundle: Bundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import vidur.execution_time_predictor.sklearn_execution_time_predictor as sk

    calls: list[object] = []

    def forbidden(*args: object, **kwargs: object) -> None:
        # Vidur catches any Exception around its hub download and trains instead: a raise alone
        # would pass unseen, so the call is counted (and pytest.fail is no Exception)
        calls.append(args)
        pytest.fail("snapshot_download called")

    monkeypatch.setattr(sk, "snapshot_download", forbidden)
    settings = replace(SETTINGS, cache_dir=str(tmp_path / "cache"))
    predictor = make_predictor(bundle, settings, QWEN3_TINY)
    assert predictor._predictions["attn_prefill"]
    assert calls == []


def test_a_truncated_cache_file_is_retrained_and_rewritten(
    bundle: Bundle, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run killed while Vidur wrote its cache left a truncated file that failed every run."""
    settings = replace(SETTINGS, cache_dir=str(tmp_path / "cache"))
    first = make_predictor(bundle, settings, QWEN3_TINY)
    cache = Path(first._config.cache_dir)
    table = next(cache.glob("predictions/*/attn_decode.csv.xz"))
    forest = next(cache.glob("predictors/*/attn_decode.pkl"))
    for path in (table, forest):
        path.write_bytes(path.read_bytes()[:40])

    second = make_predictor(bundle, settings, QWEN3_TINY)
    assert not second.cache_hit
    warned = capsys.readouterr().out.replace("\n", "")
    assert f"{table} is unreadable" in warned and f"{forest} is unreadable" in warned
    assert second._predictions["attn_decode"] == pytest.approx(first._predictions["attn_decode"])
    third = make_predictor(bundle, settings, QWEN3_TINY)
    assert third.cache_hit
    assert third._predictions["attn_decode"] == pytest.approx(first._predictions["attn_decode"])
    assert not list(cache.rglob("*.part"))  # atomic writes leave no temporary file behind
