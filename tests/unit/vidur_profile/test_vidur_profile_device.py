"""Profiling needs the configured device: a GPU profile without CUDA fails before writing."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ConfigError, HardwareConfig
from gpu_simulate_test.config.vidur import VidurProfileStageConfig
from gpu_simulate_test.core.model.device import (
    DeviceUnavailableError,
    check_device,
    describe_device,
)
from gpu_simulate_test.vidur_profile.stage import run
from tests.conftest import _has_cuda

H100 = HardwareConfig(
    name="h100", device="cuda", peak_bf16_tflops=989, memory_bandwidth_gb_s=3350, memory_gib=80
)


@pytest.mark.skipif(_has_cuda(), reason="this machine has a CUDA device")
def test_gpu_hardware_without_cuda_names_what_was_found() -> None:
    import torch

    with pytest.raises(DeviceUnavailableError) as info:
        check_device(H100)
    message = str(info.value)
    assert "hardware=h100" in message and "no CUDA device" in message
    assert f"torch {torch.__version__}" in message
    assert isinstance(info.value, ConfigError) and isinstance(info.value, ValueError)


@pytest.mark.skipif(_has_cuda(), reason="this machine has a CUDA device")
def test_stage_fails_before_creating_anything(compose_stage, tmp_path: Path) -> None:
    cfg = to_typed(
        compose_stage(
            "vidur_profile",
            [
                "hardware=h100",
                f"output.root={tmp_path / 'tmp'}",
                f"profiling_root={tmp_path / 'profiles'}",
            ],
        ),
        VidurProfileStageConfig,
    )
    with pytest.raises(DeviceUnavailableError, match="no CUDA device"):
        run(cfg, {})
    assert list(tmp_path.iterdir()) == []


def test_cpu_is_always_there_and_described() -> None:
    cpu = HardwareConfig(
        name="cpu", device="cpu", peak_bf16_tflops=1, memory_bandwidth_gb_s=20, memory_gib=24
    )
    assert check_device(cpu) == "cpu"
    described = describe_device("cpu")
    assert described["device_name"] and described["driver"] is None


@pytest.mark.gpu
def test_cuda_profile_uses_cuda_events_and_bf16() -> None:
    import torch

    from gpu_simulate_test.config.schema import ModelConfig
    from gpu_simulate_test.core.profiling.grid import ProfileGrid
    from gpu_simulate_test.vidur_profile.layer_ops import build_layer
    from gpu_simulate_test.vidur_profile.profiler import profile_tables
    from gpu_simulate_test.vidur_profile.timing import TimingPolicy

    device = check_device(H100)
    assert device == "cuda:0"
    assert describe_device(device)["device_name"] == torch.cuda.get_device_name(0)
    model = ModelConfig(
        name="small",
        num_layers=1,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        intermediate_size=512,
        vocab_size=1000,
        max_position_embeddings=4096,
    )
    layer = build_layer(model, device, torch.bfloat16)
    grid = ProfileGrid((1, 64), (1, 4), (32,), (0, 1024))
    tables = profile_tables(layer, grid, 16, TimingPolicy(warmup=1, repeats=3))
    assert (tables.mlp.filter(like=".median") > 0).all().all()
    assert (tables.attention["time_stats.attn.median"] > 0).all()
    decode = tables.attention[tables.attention["prefill_chunk_size"] == 0]
    by_kv = decode[decode["batch_size"] == 4].set_index("kv_cache_size")["time_stats.attn.median"]
    assert by_kv[1024] > 0 and by_kv[0] > 0
