"""The real_bench config: every backend composes; bad keys, types and values fail by name."""

from __future__ import annotations

import pytest

from gpu_simulate_test.config.real_bench import (
    BACKEND_NAMES,
    HfCbBackendConfig,
    RealBenchStageConfig,
)
from gpu_simulate_test.config.registry import CONFIG_DIR, STAGE_SCHEMAS, to_typed
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.core.engines.hf_cb import cb_config_kwargs, make_cb_config

BACKEND_OPTIONS = sorted(p.stem for p in (CONFIG_DIR / "backend").glob("*.yaml"))


def test_stage_is_registered_and_every_backend_has_a_yaml() -> None:
    assert STAGE_SCHEMAS["real_bench"] is RealBenchStageConfig
    assert set(BACKEND_OPTIONS) >= set(BACKEND_NAMES)


@pytest.mark.parametrize("option", sorted(set(BACKEND_OPTIONS) - set(BACKEND_NAMES)))
def test_every_other_backend_option_is_an_engine_with_knobs_its_name_starts_with(
    compose_stage, option: str
) -> None:
    """``backend/<engine>_<what>.yaml`` (a preset's engine and knobs) is that engine."""
    cfg = to_typed(
        compose_stage("real_bench", [f"backend={option}", "workload_dir=w"]), RealBenchStageConfig
    )
    assert option.startswith(f"{cfg.backend.name}_")


@pytest.mark.parametrize("backend", BACKEND_NAMES)
def test_every_backend_composes(compose_stage, backend: str) -> None:
    cfg = to_typed(
        compose_stage("real_bench", [f"backend={backend}", "workload_dir=tmp/workload/x"]),
        RealBenchStageConfig,
    )
    assert isinstance(cfg, RealBenchStageConfig) and cfg.backend.name == backend
    assert cfg.model.name == "qwen3_tiny" and cfg.hardware.device == "cpu"


def test_defaults_are_hf_cb_with_block_sharing_off(compose_stage) -> None:
    cfg = to_typed(compose_stage("real_bench", ["workload_dir=w"]), RealBenchStageConfig)
    assert isinstance(cfg.backend, HfCbBackendConfig) and cfg.backend.allow_block_sharing is False
    assert cfg.dtype == "auto" and cfg.attn_implementation == "sdpa"


def test_workload_dir_is_required(compose_stage) -> None:
    with pytest.raises(ConfigError, match="workload_dir"):
        to_typed(compose_stage("real_bench", []), RealBenchStageConfig)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("backend.name=tgi", "backend.name='tgi'"),
        ("backend.max_num_batched_tokens=0", "backend.max_num_batched_tokens must be >= 1"),
        ("backend.block_size=2", "backend.block_size must be >= 4"),
        ("dtype=int8", "dtype='int8'"),
        ("attn_implementation=magic", "attn_implementation='magic'"),
        ("backend=openai backend.base_url=localhost:8000", "backend.base_url='localhost:8000'"),
        ("backend=openai backend.server.kind=docker", "backend.server.kind='docker'"),
        ("backend=vllm backend.client=curl", "backend.client='curl'"),
    ],
)
def test_bad_values_fail_naming_the_field(compose_stage, override: str, message: str) -> None:
    cfg = compose_stage("real_bench", ["workload_dir=w", *override.split()])
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        to_typed(cfg, RealBenchStageConfig)


def test_mistyped_key_and_wrong_type_fail(compose_stage) -> None:
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException, match="max_batch_token"):
        compose_stage("real_bench", ["workload_dir=w", "backend.max_batch_token=8"])
    with pytest.raises(ConfigCompositionException, match="num_gpu_blocks_override"):
        compose_stage("real_bench", ["workload_dir=w", "backend.num_gpu_blocks_override=many"])


def test_hf_cb_knobs_map_onto_transformers_names(compose_stage) -> None:
    cfg = to_typed(
        compose_stage(
            "real_bench",
            ["workload_dir=w", "backend.max_num_batched_tokens=64", "backend.block_size=32"],
        ),
        RealBenchStageConfig,
    )
    kwargs = cb_config_kwargs(cfg)
    assert kwargs["max_batch_tokens"] == 64 and kwargs["page_size"] == 32
    assert kwargs["allow_block_sharing"] is False and kwargs["use_cuda_graph"] is False
    cb, dropped = make_cb_config(cfg)
    assert dropped == {}
    assert isinstance(cfg.backend, HfCbBackendConfig)
    blocks = cfg.backend.num_gpu_blocks_override
    assert (cb.max_batch_tokens, cb.page_size, cb.num_blocks) == (64, 32, blocks)
