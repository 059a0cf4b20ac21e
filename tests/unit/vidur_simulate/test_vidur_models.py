"""Qwen3 models, devices and the fixed Orca made known to Vidur, and the head_dim patch."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from gpu_simulate_test.config.registry import CONFIG_DIR
from gpu_simulate_test.config.schema import HardwareConfig, ModelConfig
from gpu_simulate_test.config.vidur import VidurSchedulerConfig
from gpu_simulate_test.vidur_simulate import models
from gpu_simulate_test.vidur_simulate.devices import register_device
from gpu_simulate_test.vidur_simulate.registration import register_vidur_extensions
from gpu_simulate_test.vidur_simulate.schedulers import ORCA_FIXED_TYPE, vidur_scheduler_config
from tests.vidur_bundle_factory import QWEN3_0_6B, QWEN3_TINY

vidur_config = pytest.importorskip("vidur.config")
BaseModelConfig = vidur_config.BaseModelConfig
ReplicaConfig = vidur_config.ReplicaConfig

MODEL_YAMLS = sorted((CONFIG_DIR / "model").glob("*.yaml"))
CPU = HardwareConfig(
    name="cpu", device="cpu", peak_bf16_tflops=1.0, memory_bandwidth_gb_s=20.0, memory_gib=24.0
)
H200 = HardwareConfig(
    name="h200", device="cuda", peak_bf16_tflops=989.0, memory_bandwidth_gb_s=4800, memory_gib=141
)


def load_model_yaml(path: Path) -> ModelConfig:
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(path))
    model = OmegaConf.to_object(merged)
    assert isinstance(model, ModelConfig)
    return model


def test_every_shipped_model_config_is_a_family_member() -> None:
    assert len(MODEL_YAMLS) == 5
    names = {models.vidur_model_name(load_model_yaml(p)) for p in MODEL_YAMLS}
    assert names == set(models.qwen3_family())


@pytest.mark.parametrize("path", MODEL_YAMLS, ids=lambda p: p.stem)
def test_vidur_finds_each_model_by_name(path: Path) -> None:
    model = load_model_yaml(path)
    name = models.vidur_model_name(model)
    if model.hf_name:
        assert name == model.hf_name
    vidur_model = BaseModelConfig.create_from_name(name)
    assert vidur_model.get_name() == name
    assert (vidur_model.num_layers, vidur_model.embedding_dim) == (
        model.num_layers,
        model.hidden_size,
    )
    assert (vidur_model.num_q_heads, vidur_model.num_kv_heads) == (
        model.num_attention_heads,
        model.num_key_value_heads,
    )
    assert vidur_model.mlp_hidden_dim == model.intermediate_size
    assert vidur_model.max_model_len == model.max_position_embeddings
    assert vidur_model.head_dim == model.head_dim


def test_every_model_subclass_has_a_name() -> None:
    """One subclass without get_name() would break every Vidur model lookup."""
    from vidur.config.utils import get_all_subclasses

    models.register_qwen3_models()
    names = [cls.get_name() for cls in get_all_subclasses(BaseModelConfig)]
    assert models.FAMILY_BASE_NAME in names and "Qwen/Qwen3-8B" in names


def test_registration_is_idempotent() -> None:
    from vidur.config.utils import get_all_subclasses

    register_vidur_extensions(QWEN3_TINY, CPU)
    before = len(get_all_subclasses(BaseModelConfig))
    for _ in range(3):
        register_vidur_extensions(QWEN3_TINY, CPU)
        models.register_qwen3_models()
    assert len(get_all_subclasses(BaseModelConfig)) == before


def test_a_custom_shape_gets_its_own_name() -> None:
    custom = replace(QWEN3_0_6B, name="qwen3_custom", num_layers=4)
    name = models.vidur_model_name(custom)
    assert name.startswith("gst/qwen3_custom-") and name == models.vidur_model_name(custom)
    assert BaseModelConfig.create_from_name(name).num_layers == 4
    # same name, other shape: never the same Vidur model
    assert models.vidur_model_name(replace(custom, num_layers=6)) != name


def test_head_dim_patch_gives_qwen3_its_128() -> None:
    name, device = register_vidur_extensions(QWEN3_0_6B, CPU)
    replica = ReplicaConfig(
        model_name=name,
        num_pipeline_stages=1,
        tensor_parallel_size=1,
        device=device.device,
        network_device=device.network_device,
    )
    assert replica.attention_head_dim == 64  # Vidur's hidden / heads
    assert models.patch_head_dim(replica, QWEN3_0_6B)
    assert replica.attention_head_dim == 128
    from vidur.utils.memory_planner import MemoryPlanner

    per_token = MemoryPlanner(replica, vidur_config.CacheConfig())
    assert (
        per_token._get_kv_cache_memory_per_device_per_token() == QWEN3_0_6B.kv_cache_bytes_per_token
    )


def test_devices_come_from_the_hardware_config() -> None:
    from vidur.config.device_sku_config import BaseDeviceSKUConfig
    from vidur.config.node_sku_config import BaseNodeSKUConfig

    h200 = register_device(H200)
    assert (h200.device, h200.network_device, h200.builtin) == ("h200", "h200_node", False)
    sku = BaseDeviceSKUConfig.create_from_type_string("h200")
    assert (sku.total_memory_gb, sku.fp16_tflops) == (141.0, 989.0)
    assert BaseNodeSKUConfig.create_from_type_string("h200_node").num_devices_per_node == 1
    assert register_device(H200) == h200  # idempotent
    bigger = register_device(replace(H200, memory_gib=282.0))
    assert bigger.device != "h200" and bigger.total_memory_gb == 282.0
    h100 = register_device(replace(H200, name="h100", memory_gib=80.0))
    assert h100.builtin and h100.network_device == "h100_pairwise_nvlink"


def test_orca_runs_the_fixed_scheduler() -> None:
    from vidur.scheduler.replica_scheduler.replica_scheduler_registry import (
        ReplicaSchedulerRegistry,
    )

    register_vidur_extensions(QWEN3_TINY, CPU)
    config = vidur_scheduler_config(VidurSchedulerConfig(name="orca", batch_size_cap=8))
    assert config.get_type() == ORCA_FIXED_TYPE and config.batch_size_cap == 8
    assert ORCA_FIXED_TYPE in ReplicaSchedulerRegistry._registry
    sarathi = vidur_scheduler_config(VidurSchedulerConfig(name="sarathi", chunk_size=128))
    assert str(sarathi.get_type()) == "sarathi" and sarathi.chunk_size == 128
