"""Qwen3 built from our config (random weights) or loaded from a local snapshot directory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ModelConfig, WorkloadStageConfig
from gpu_simulate_test.core.model.modeling import build_model, hf_config


@pytest.fixture
def tiny(compose_stage) -> ModelConfig:
    return to_typed(compose_stage("workload"), WorkloadStageConfig).model


def test_random_tiny_qwen3_runs_a_forward_pass(tiny: ModelConfig) -> None:
    net = build_model(tiny)
    assert type(net).__name__ == "Qwen3ForCausalLM"
    assert net.config.head_dim == 32 and net.config.num_hidden_layers == 2
    with torch.no_grad():
        logits = net(torch.tensor([[1, 2, 3, 4]])).logits
    assert logits.shape == (1, 4, tiny.vocab_size)


def test_qwen3_0_6b_config_has_the_real_parameter_count(compose_stage) -> None:
    model = to_typed(compose_stage("workload", ["model=qwen3_0_6b"]), WorkloadStageConfig).model
    with torch.device("meta"):
        from transformers import Qwen3ForCausalLM

        net = Qwen3ForCausalLM(hf_config(model))
    # Qwen3-0.6B: 596M parameters with tied embeddings (751,632,384 untied)
    assert sum(p.numel() for p in net.parameters()) == 596_049_920


def test_local_snapshot_loads_and_mismatch_is_named(tiny: ModelConfig, tmp_path: Path) -> None:
    build_model(tiny).save_pretrained(tmp_path / "snap")
    loaded = build_model(replace(tiny, local_path=str(tmp_path / "snap")))
    assert loaded.config.hidden_size == tiny.hidden_size
    with pytest.raises(ValueError, match="num_layers=3 but num_hidden_layers=2"):
        build_model(replace(tiny, local_path=str(tmp_path / "snap"), num_layers=3))
    with pytest.raises(FileNotFoundError, match=r"no config\.json"):
        build_model(replace(tiny, local_path=str(tmp_path)))
