"""A random-forest execution-time predictor trained on a local profiling bundle, never the HF hub.

Vidur's ``SklearnExecutionTimePredictor.__init__`` first tries ``_load_predictions_from_hf()``
(a ``snapshot_download``), and on failure trains from ``_get_input_files()`` (two more
downloads). Both are overridden: input files are the bundle's CSVs, and "loading from HF" loads
our cached prediction tables, or trains and predicts when there are none.

Vidur's own cache key (md5 of a few settings) ignores the model, the profile contents and the
forest settings, so two models would share entries. Ours: ``cache_dir/<fingerprint>/`` where the
fingerprint hashes the bundle CSV bytes, the model dimensions, every predictor setting and the
Vidur version; the fingerprint is also mixed into Vidur's key.

Vidur writes its cache files (forest pickles, ``.csv.xz`` prediction tables) in place, so a run
killed mid-write left a truncated file that every later run with the same fingerprint failed to
read. Ours are written to a temporary name and renamed, and an unreadable cache file is reported
and retrained rather than trusted.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from fasteners import InterProcessReaderWriterLock  # type: ignore[import-untyped]
from rich.markup import escape
from sklearn.ensemble import RandomForestRegressor
from vidur.config import RandomForrestExecutionTimePredictorConfig
from vidur.entities import Batch
from vidur.execution_time_predictor import ExecutionTimePredictorRegistry
from vidur.execution_time_predictor.random_forrest_execution_time_predictor import (
    RandomForrestExecutionTimePredictor,
)
from vidur.execution_time_predictor.sklearn_execution_time_predictor import (
    ModelType,
    _load_prediction_file,
    _store_prediction_file,
)

from gpu_simulate_test.calibration.overhead import ExecutionTimeWithOverhead, StepOverhead
from gpu_simulate_test.config.schema import ModelConfig
from gpu_simulate_test.config.vidur import VidurPredictorConfig
from gpu_simulate_test.core.profiling.bundle import Bundle
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import atomic_open, atomic_path
from gpu_simulate_test.vidur_simulate.models import vidur_fields

LOCAL_RF_TYPE = "local_random_forrest"
"""Registry key (a plain string: Vidur's predictor-type enum cannot be extended)."""
COMPUTE_OPS: tuple[str, ...] = (
    "attn_pre_proj",
    "attn_post_proj",
    "mlp_up_proj",
    "mlp_down_proj",
    "mlp_act",
    "attn_rope",
    "attn_kv_cache_save",
    "input_layernorm",
    "post_attention_layernorm",
    "add",
    "attn_prefill",
    "attn_decode",
)
"""The prediction tables a TP=1, PP=1 simulation reads."""
RANDOM_STATE = 0
"""Seed of every forest, so training is reproducible."""


def _unreadable(path: str, exc: Exception) -> None:
    console.print(
        f"[yellow]warning:[/] predictor cache file {escape(path)} is unreadable "
        f"({type(exc).__name__}: {escape(str(exc))}); retraining",
        soft_wrap=True,
    )


@dataclass
class LocalRFExecutionTimePredictorConfig(RandomForrestExecutionTimePredictorConfig):
    """Vidur's random-forest config plus where the bundle is and our cache fingerprint."""

    profile_dir: str = ""
    fingerprint: str = ""

    @staticmethod
    def get_type() -> str:
        return LOCAL_RF_TYPE


class LocalRFExecutionTimePredictor(RandomForrestExecutionTimePredictor):
    """Reads ``<profile_dir>/{mlp,attention}.csv``; caches under the fingerprinted cache_dir.

    With a :class:`StepOverhead` attached (``attach_overhead``), every batch's total time also
    carries the engine's per-step overhead (see :mod:`gpu_simulate_test.calibration.overhead`).
    """

    cache_hit: bool = False
    """Set by __init__: True when every prediction table came from the cache."""
    step_overhead: StepOverhead | None = None
    step_jitter: Callable[[], float] | None = None
    """Draws each batch's jitter factor (None: every step at its calibrated median)."""
    step_scale: float = 1.0
    """Every batch's total time is multiplied by this (``vidur.step_time_scale``)."""

    def ops_time_ms(self, num_q_tokens: list[int], num_kv_tokens: list[int]) -> float:
        """Vidur's own prediction (profiled ops only) for a batch of this shape."""
        batch = Batch(0, [None] * len(num_q_tokens), num_q_tokens, num_kv_tokens)
        return float(super().get_execution_time(batch, 0).total_time) * 1e3

    def attach_overhead(
        self, overhead: StepOverhead | None, jitter: Callable[[], float] | None = None
    ) -> None:
        self.step_overhead = overhead
        self.step_jitter = jitter

    def get_execution_time(self, batch: Any, pipeline_stage: int) -> Any:
        base = super().get_execution_time(batch, pipeline_stage)
        if self.step_overhead is None:
            if self.step_scale == 1.0:
                return base
            return ExecutionTimeWithOverhead(base, 0.0, self.step_scale)
        factor = self.step_jitter() if self.step_jitter is not None else 1.0
        return ExecutionTimeWithOverhead(
            base,
            self.step_overhead.ms(batch.num_q_tokens),
            factor * self.step_scale,
            self.step_overhead.scale_for(batch.num_q_tokens),
        )

    def _get_input_files(self) -> tuple[str, str, str, str]:
        profile = Path(self._config.profile_dir)
        # network profiles are read only for TP > 1 (all_reduce) or PP > 1 (send_recv)
        return (
            str(profile / layout.MLP_PROFILE),
            str(profile / layout.ATTENTION_PROFILE),
            str(profile / "all_reduce.csv"),
            str(profile / "send_recv.csv"),
        )

    def _get_compute_model_config(self) -> dict[str, Any]:
        return {**super()._get_compute_model_config(), "fingerprint": self._config.fingerprint}

    def _get_network_model_config(self) -> dict[str, Any]:
        return {**super()._get_network_model_config(), "fingerprint": self._config.fingerprint}

    def _prediction_files(self) -> dict[str, str]:
        folder = os.path.join(self._cache_dir, "predictions", self._get_hash(ModelType.COMPUTE))
        return {op: os.path.join(folder, f"{op}.csv.xz") for op in COMPUTE_OPS}

    def _load_predictions_from_hf(self) -> dict[str, dict[tuple[Any, ...], float]]:
        """Cached prediction tables when complete, else train on the bundle and predict."""
        files = self._prediction_files()
        if not self._config.no_cache and all(os.path.exists(f) for f in files.values()):
            lock = f"{self._cache_dir}/{self._get_hash(ModelType.COMPUTE)}_prediction_lock.file"
            with InterProcessReaderWriterLock(lock).read_lock():
                predictions = {}
                for op, path in files.items():
                    try:
                        predictions[op] = _load_prediction_file(path)
                    except Exception as exc:  # any damage: retrain, which rewrites the file
                        _unreadable(path, exc)
                        break
            if len(predictions) == len(files):
                self.cache_hit = True
                return predictions
        self.cache_hit = False
        return self._predict_from_models(self._train_models())

    def _load_model_from_cache(self, model_name: str, model_hash: str) -> Any:
        try:
            return super()._load_model_from_cache(model_name, model_hash)
        except Exception as exc:
            _unreadable(f"{self._cache_dir}/predictors/{model_hash}/{model_name}.pkl", exc)
            return None

    def _store_model_in_cache(self, model_name: str, model_hash: str, model: Any) -> None:
        lock = f"{self._cache_dir}/{model_hash}_model_lock.file"
        final = f"{self._cache_dir}/predictors/{model_hash}/{model_name}.pkl"
        with InterProcessReaderWriterLock(lock).write_lock(), atomic_open(final, "wb") as handle:
            pickle.dump(model, handle, protocol=pickle.HIGHEST_PROTOCOL)

    def _load_model_prediction_cache(
        self, model_name: str, model_hash: str
    ) -> dict[tuple[Any, ...], float]:
        try:
            return dict(super()._load_model_prediction_cache(model_name, model_hash))
        except Exception as exc:
            _unreadable(f"{self._cache_dir}/predictions/{model_hash}/{model_name}.csv.xz", exc)
            return {}

    def _store_model_prediction_cache(
        self, model_name: str, model_hash: str, predictions: dict[tuple[Any, ...], float]
    ) -> None:
        lock = f"{self._cache_dir}/{model_hash}_prediction_lock.file"
        final = f"{self._cache_dir}/predictions/{model_hash}/{model_name}.csv.xz"
        with InterProcessReaderWriterLock(lock).write_lock(), atomic_path(final) as tmp:
            _store_prediction_file(str(tmp), predictions)

    def _upload_predictions_to_hf(self) -> None:
        return None

    def _get_estimator(self) -> RandomForestRegressor:
        # Vidur leaves random_state unset: forests would differ between runs (and between
        # joblib workers), so two cold runs of one config would predict different times
        return RandomForestRegressor(random_state=RANDOM_STATE)


def register_predictor() -> None:
    """Register the local predictor with Vidur (idempotent: Vidur ignores a repeated key)."""
    ExecutionTimePredictorRegistry.register(LOCAL_RF_TYPE, LocalRFExecutionTimePredictor)


def vidur_version() -> str:
    return metadata.version("vidur")


def predictor_settings(
    settings: VidurPredictorConfig, bounds: dict[str, int], block_size: int
) -> dict[str, Any]:
    """Every setting that changes a prediction (Vidur's field names)."""
    return {
        "num_estimators": [settings.num_estimators],
        "max_depth": [settings.max_depth],
        "min_samples_split": [settings.min_samples_split],
        "k_fold_cv_splits": settings.k_fold_cv_splits,
        "kv_cache_prediction_granularity": settings.kv_cache_prediction_granularity,
        "block_size": block_size,
        "random_state": RANDOM_STATE,
        **bounds,
    }


def fingerprint(bundle_files: list[Path], model: ModelConfig, settings: dict[str, Any]) -> str:
    """sha256 of the bundle CSV bytes, the model dimensions, the settings and the Vidur version."""
    digest = hashlib.sha256()
    for path in bundle_files:
        digest.update(path.name.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    dims = {k: str(v) for k, v in vidur_fields(model).items()}
    digest.update(json.dumps(dims, sort_keys=True).encode())
    digest.update(json.dumps(settings, sort_keys=True).encode())
    digest.update(f"vidur=={vidur_version()}".encode())
    return digest.hexdigest()[:16]


def predictor_config(
    bundle: Bundle,
    model: ModelConfig,
    settings: VidurPredictorConfig,
    bounds: dict[str, int],
    block_size: int,
) -> LocalRFExecutionTimePredictorConfig:
    """The Vidur predictor config for this bundle, with its fingerprinted cache directory."""
    values = predictor_settings(settings, bounds, block_size)
    fp = fingerprint([bundle.mlp_path, bundle.attention_path], model, values)
    values.pop("block_size")  # a CacheConfig field, not the predictor's
    values.pop("random_state")  # fixed in LocalRFExecutionTimePredictor._get_estimator
    return LocalRFExecutionTimePredictorConfig(
        profile_dir=str(bundle.path),
        fingerprint=fp,
        model_profiling_dataset=f"local:{fp}",
        network_profiling_dataset=f"local:{fp}",
        cache_dir=str(Path(settings.cache_dir) / fp),
        no_cache=settings.no_cache,
        num_training_job_threads=settings.num_training_job_threads,
        upload_predictions=False,
        use_native_execution_time_predictor=False,
        **values,
    )
