"""Static analysis: parameter counts, FLOPs checked against torch's FlopCounterMode, roofline."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from gpu_simulate_test.config.presets import hardware_preset, model_preset
from gpu_simulate_test.config.schema import ModelConfig
from gpu_simulate_test.core.model.modeling import build_model, hf_config
from gpu_simulate_test.deep_profile.static_analysis import (
    attention_pairs,
    cost_table,
    decode_cost,
    kv_cache_bytes_per_token,
    parameter_counts,
    prefill_cost,
    step_roofline,
)


@pytest.fixture(scope="module")
def tiny() -> ModelConfig:
    return model_preset("qwen3_tiny")


@pytest.fixture(scope="module")
def qwen06() -> ModelConfig:
    return model_preset("qwen3_0_6b")


@pytest.fixture(scope="module")
def eager_tiny(tiny: ModelConfig) -> Any:
    # eager attention: CPU SDPA is not counted by FlopCounterMode (no formula is registered
    # for aten._scaled_dot_product_flash_attention_for_cpu), eager's bmm is
    return build_model(tiny, attn_implementation="eager")


def _count(fn: Any) -> dict[str, int]:
    counter = FlopCounterMode(display=False)
    with torch.no_grad(), counter:
        fn()
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


def test_qwen3_0_6b_parameters_match_the_published_count(qwen06: ModelConfig) -> None:
    assert parameter_counts(qwen06).total == 596_049_920
    untied = replace(qwen06, tie_word_embeddings=False)
    assert parameter_counts(untied).total == 751_632_384
    # the op-level sum agrees with the component count (LM head counted once when tied)
    assert prefill_cost(qwen06, 8).params == 596_049_920
    assert prefill_cost(untied, 8).params == 751_632_384


def test_parameter_count_equals_the_hf_module(tiny: ModelConfig) -> None:
    for tied in (True, False):
        model = replace(tiny, tie_word_embeddings=tied)
        with torch.device("meta"):
            from transformers import Qwen3ForCausalLM

            net = Qwen3ForCausalLM(hf_config(model))
        unique = {id(p): p.numel() for p in net.parameters()}
        assert parameter_counts(model).total == sum(unique.values())


def test_kv_cache_bytes_use_the_real_head_dim(qwen06: ModelConfig) -> None:
    # 2 (K, V) x 28 layers x 8 kv heads x 128 head_dim x 2 bytes
    assert kv_cache_bytes_per_token(qwen06) == 114_688 == qwen06.kv_cache_bytes_per_token
    assert kv_cache_bytes_per_token(qwen06, "float32") == 2 * 114_688
    with pytest.raises(ValueError, match="dtype='int3'"):
        kv_cache_bytes_per_token(qwen06, "int3")


def test_causal_pairs() -> None:
    assert attention_pairs(4, 0) == 10  # 1 + 2 + 3 + 4
    assert attention_pairs(1, 99) == 100  # one decode token sees the cache and itself
    assert attention_pairs(2, 3) == 4 + 5


def test_prefill_flops_match_flop_counter(tiny: ModelConfig, eager_tiny: Any) -> None:
    prompt = 16
    ids = torch.randint(0, 1000, (1, prompt))
    counted = _count(lambda: eager_tiny(input_ids=ids, logits_to_keep=1))
    cost = prefill_cost(tiny, prompt, lm_head_tokens="last")
    projections = cost.matmul_flops - cost.attention_flops
    # projections, MLP and LM head: aten.mm, exactly
    assert counted["aten.mm"] == projections
    # attention: eager computes the full S x S score matrix and masks it afterwards, so the
    # counter sees P^2 pairs where the causal formula counts P(P+1)/2
    assert counted["aten.bmm"] == cost.attention_flops * prompt * prompt // attention_pairs(
        prompt, 0
    )
    total_counted = sum(counted.values())
    assert abs(cost.matmul_flops - total_counted) / total_counted < 0.01


def test_prefill_lm_head_on_all_positions(tiny: ModelConfig, eager_tiny: Any) -> None:
    ids = torch.randint(0, 1000, (2, 8))
    counted = _count(lambda: eager_tiny(input_ids=ids))
    cost = prefill_cost(tiny, 8, batch_size=2, lm_head_tokens="all")
    assert counted["aten.mm"] == cost.matmul_flops - cost.attention_flops


def test_decode_flops_match_flop_counter(tiny: ModelConfig, eager_tiny: Any) -> None:
    context = 12
    ids = torch.randint(0, 1000, (1, context))
    with torch.no_grad():
        cache = eager_tiny(input_ids=ids, use_cache=True).past_key_values
    nxt = torch.randint(0, 1000, (1, 1))
    counted = _count(lambda: eager_tiny(input_ids=nxt, past_key_values=cache, logits_to_keep=1))
    cost = decode_cost(tiny, context)
    # no mask to waste work on in decode: both the projections and attention are exact
    assert counted["aten.mm"] == cost.matmul_flops - cost.attention_flops
    assert counted["aten.bmm"] == cost.attention_flops


def test_decode_bytes_grow_by_one_token_of_kv_cache(qwen06: ModelConfig) -> None:
    short, longer = decode_cost(qwen06, 1000), decode_cost(qwen06, 1001)
    assert longer.bytes_moved - short.bytes_moved == kv_cache_bytes_per_token(qwen06)
    assert longer.flops > short.flops
    # batching shares the weights: bytes per sequence fall with batch size
    b8 = decode_cost(qwen06, 1000, batch_size=8)
    assert b8.bytes_moved < 8 * short.bytes_moved
    assert b8.flops == pytest.approx(8 * short.flops, rel=1e-9)


def test_roofline_decode_memory_bound_prefill_compute_bound(qwen06: ModelConfig) -> None:
    h100 = hardware_preset("h100")
    decode = step_roofline(decode_cost(qwen06, 512), h100)
    assert decode.bound == "memory"
    # ~1.19 GB of bf16 weights (+ a little KV cache) at 3.35 TB/s
    weight_s = 596_049_920 * 2 / 3350e9
    assert weight_s < decode.bound_time_s < 1.1 * weight_s
    prefill = step_roofline(prefill_cost(qwen06, 4096), h100)
    assert prefill.bound == "compute"
    assert prefill.bound_time_s == pytest.approx(prefill.flops / 989e12)
    assert prefill.arithmetic_intensity_flop_per_byte > prefill.ridge_point_flop_per_byte


def test_to_dict_and_table(tiny: ModelConfig) -> None:
    cost = prefill_cost(tiny, 32)
    d = cost.to_dict()
    assert d["flops"] == cost.flops and d["layer"]["ops"][1]["name"] == "q_proj"
    assert cost.layer.op("k_proj").params == tiny.hidden_size * 2 * tiny.head_dim
    rows = cost_table(
        tiny, hardware_preset("h100"), prompt_lens=(16, 32), context_lens=(64,), batch_sizes=(1, 4)
    )
    assert len(rows) == 6
    assert {r["phase"] for r in rows} == {"prefill", "decode"}
    with pytest.raises(ValueError, match="prompt_len must be >= 1"):
        prefill_cost(tiny, 0)
