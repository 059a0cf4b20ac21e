"""The operations of one Qwen3 decoder layer, as zero-argument callables ready to be timed.

Every op runs the real modules of ``transformers``' ``Qwen3DecoderLayer`` (built from our model
config with random weights: timing does not depend on weight values), on the profiling device and
dtype, with inputs prepared outside the timed call. What each Vidur op contains is in
:data:`OP_DEFINITIONS` (written to the bundle's meta.json) and ``docs/vidur_profile.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpu_simulate_test.config.schema import ConfigError, ModelConfig

SUPPORTED_ATTN_IMPLEMENTATIONS: tuple[str, ...] = ("sdpa", "eager")

OP_DEFINITIONS: Mapping[str, str] = MappingProxyType(
    {
        "emb": "embed_tokens(input_ids): the embedding lookup (once per model, not per layer)",
        "input_layernorm": "input_layernorm (Qwen3RMSNorm over hidden_size)",
        "attn_pre_proj": "q_proj + k_proj + v_proj",
        "attn_rope": (
            "Qwen3's per-head q_norm and k_norm (RMSNorm over head_dim, with the view/transpose to "
            "heads) folded in, plus apply_rotary_pos_emb on q and k; cos/sin are computed once per "
            "forward by the model, so they are not included"
        ),
        "attn_post_proj": "o_proj",
        "post_attention_layernorm": "post_attention_layernorm (Qwen3RMSNorm over hidden_size)",
        "mlp_up_proj": "gate_proj + up_proj",
        "mlp_act": "act_fn(gate) * up (SiLU and the elementwise product)",
        "mlp_down_proj": "down_proj",
        "add": (
            "both residual adds of the layer (after attention and after the MLP), since Vidur "
            "counts 'add' once per layer"
        ),
        "attn_prefill": (
            "the transformers attention function (ALL_ATTENTION_FUNCTIONS[attn_implementation]) "
            "for one prefill chunk of batch 1 over kv_cache_size + chunk keys: causal (is_causal) "
            "without a past, a boolean causal mask as transformers builds one with a past; GQA as "
            "transformers handles it (enable_gqa or repeat_kv)"
        ),
        "attn_decode": (
            "the transformers attention function for batch_size single-token queries over "
            "kv_cache_size + 1 keys each, no mask"
        ),
        "attn_kv_cache_save": (
            "index_copy_ of the new K and V (num_tokens = chunk, or batch_size for decode) into a "
            "preallocated token-major cache [slots, kv_heads, head_dim], as transformers' paged "
            "and static caches write; decode tokens land one per block"
        ),
    }
)


def check_attn_implementation(name: str) -> None:
    """Fail unless ``name`` is an attention implementation this profiler reproduces."""
    if name not in SUPPORTED_ATTN_IMPLEMENTATIONS:
        raise ConfigError(
            f"profiling.attn_implementation={name!r} is not supported by vidur_profile; use one "
            f"of {', '.join(SUPPORTED_ATTN_IMPLEMENTATIONS)}"
        )


@dataclass
class QwenLayer:
    """One random-weight Qwen3 decoder layer plus the embedding and rotary modules around it."""

    model: ModelConfig
    device: str
    dtype: Any
    attn_implementation: str
    layer: Any
    embed: Any
    rotary: Any
    attention_fn: Callable[..., Any]
    apply_rotary: Callable[..., Any]

    @property
    def attn(self) -> Any:
        return self.layer.self_attn

    @property
    def mlp(self) -> Any:
        return self.layer.mlp


def build_layer(
    model: ModelConfig, device: str, dtype: Any, attn_implementation: str = "sdpa"
) -> QwenLayer:
    """Build the modules on ``device`` in ``dtype``, in eval mode."""
    import torch
    from transformers.models.qwen3 import modeling_qwen3

    from gpu_simulate_test.core.model.modeling import hf_config

    check_attn_implementation(attn_implementation)
    config = hf_config(model, attn_implementation)
    torch.manual_seed(0)
    with torch.device(device):
        layer = modeling_qwen3.Qwen3DecoderLayer(config, layer_idx=0)
        embed = torch.nn.Embedding(
            config.vocab_size, config.hidden_size, getattr(config, "pad_token_id", None)
        )
        rotary = modeling_qwen3.Qwen3RotaryEmbedding(config=config)
    layer = layer.to(dtype=dtype).eval()
    embed = embed.to(dtype=dtype).eval()
    if attn_implementation == "eager":
        attention_fn = modeling_qwen3.eager_attention_forward
    else:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        attention_fn = ALL_ATTENTION_FUNCTIONS[attn_implementation]
    return QwenLayer(
        model=model,
        device=device,
        dtype=dtype,
        attn_implementation=attn_implementation,
        layer=layer,
        embed=embed,
        rotary=rotary.eval(),
        attention_fn=attention_fn,
        apply_rotary=modeling_qwen3.apply_rotary_pos_emb,
    )


def token_ops(q: QwenLayer, num_tokens: int) -> dict[str, Callable[[], Any]]:
    """The per-token ops (mlp.csv) for a batch of ``num_tokens`` tokens, keyed by Vidur op name."""
    import torch

    m = q.model
    opts = {"device": q.device, "dtype": q.dtype}
    hidden = torch.randn(1, num_tokens, m.hidden_size, **opts)
    residual = torch.randn(1, num_tokens, m.hidden_size, **opts)
    input_ids = torch.randint(0, m.vocab_size, (1, num_tokens), device=q.device)
    position_ids = torch.arange(num_tokens, device=q.device)[None, :]
    cos, sin = q.rotary(hidden, position_ids)
    attn, mlp = q.attn, q.mlp
    q_lin, k_lin = attn.q_proj(hidden), attn.k_proj(hidden)
    head_shape = (1, num_tokens, -1, m.head_dim)
    attn_out = torch.randn(1, num_tokens, m.num_attention_heads * m.head_dim, **opts)
    gate, up = mlp.gate_proj(hidden), mlp.up_proj(hidden)
    act = mlp.act_fn(gate) * up

    def rope() -> Any:
        query = attn.q_norm(q_lin.view(head_shape)).transpose(1, 2)
        key = attn.k_norm(k_lin.view(head_shape)).transpose(1, 2)
        return q.apply_rotary(query, key, cos, sin)

    return {
        "emb": lambda: q.embed(input_ids),
        "input_layernorm": lambda: q.layer.input_layernorm(hidden),
        "attn_pre_proj": lambda: (attn.q_proj(hidden), attn.k_proj(hidden), attn.v_proj(hidden)),
        "attn_rope": rope,
        "attn_post_proj": lambda: attn.o_proj(attn_out),
        "post_attention_layernorm": lambda: q.layer.post_attention_layernorm(hidden),
        "mlp_up_proj": lambda: (mlp.gate_proj(hidden), mlp.up_proj(hidden)),
        "mlp_act": lambda: mlp.act_fn(gate) * up,
        "mlp_down_proj": lambda: mlp.down_proj(act),
        "add": lambda: (residual + hidden, hidden + residual),
    }


def _causal_mask(q: QwenLayer, chunk: int, past: int) -> Any:
    """Query i (position past + i) sees keys 0..past + i: boolean for sdpa, additive for eager."""
    import torch

    keys = torch.arange(past + chunk, device=q.device)
    allowed = keys[None, :] <= (past + torch.arange(chunk, device=q.device))[:, None]
    allowed = allowed[None, None, :, :]
    if q.attn_implementation == "sdpa":
        return allowed
    blocked = torch.full(allowed.shape, torch.finfo(q.dtype).min, device=q.device, dtype=q.dtype)
    return torch.where(allowed, torch.zeros((), device=q.device, dtype=q.dtype), blocked)


def _attention_call(q: QwenLayer, query: Any, key: Any, value: Any, mask: Any) -> Callable[[], Any]:
    attn = q.attn

    def call() -> Any:
        return q.attention_fn(
            attn, query, key, value, mask, dropout=0.0, scaling=attn.scaling, sliding_window=None
        )

    return call


def prefill_attention(q: QwenLayer, chunk: int, kv_cache_size: int) -> Callable[[], Any]:
    """One prefill chunk of ``chunk`` tokens (batch 1) after ``kv_cache_size`` cached tokens."""
    import torch

    m = q.model
    opts = {"device": q.device, "dtype": q.dtype}
    total = kv_cache_size + chunk
    query = torch.randn(1, m.num_attention_heads, chunk, m.head_dim, **opts)
    key = torch.randn(1, m.num_key_value_heads, total, m.head_dim, **opts)
    value = torch.randn(1, m.num_key_value_heads, total, m.head_dim, **opts)
    # transformers skips the mask (is_causal) when there is no past; eager always needs one
    needs_mask = kv_cache_size > 0 or q.attn_implementation == "eager"
    mask = _causal_mask(q, chunk, kv_cache_size) if needs_mask else None
    return _attention_call(q, query, key, value, mask)


def decode_attention(q: QwenLayer, batch_size: int, kv_cache_size: int) -> Callable[[], Any]:
    """``batch_size`` decode queries, each over ``kv_cache_size`` cached tokens plus its own."""
    import torch

    m = q.model
    opts = {"device": q.device, "dtype": q.dtype}
    total = kv_cache_size + 1
    query = torch.randn(batch_size, m.num_attention_heads, 1, m.head_dim, **opts)
    key = torch.randn(batch_size, m.num_key_value_heads, total, m.head_dim, **opts)
    value = torch.randn(batch_size, m.num_key_value_heads, total, m.head_dim, **opts)
    return _attention_call(q, query, key, value, None)


def kv_cache_save(
    q: QwenLayer, num_tokens: int, block_size: int, decode: bool
) -> Callable[[], Any]:
    """Write ``num_tokens`` new K and V rows into a preallocated cache with ``index_copy_``.

    Prefill tokens go to consecutive slots; decode tokens (one per request) one per block.
    """
    import torch

    m = q.model
    opts = {"device": q.device, "dtype": q.dtype}
    stride = block_size if decode else 1
    slots = num_tokens * stride
    k_cache = torch.zeros(slots, m.num_key_value_heads, m.head_dim, **opts)
    v_cache = torch.zeros(slots, m.num_key_value_heads, m.head_dim, **opts)
    new_k = torch.randn(num_tokens, m.num_key_value_heads, m.head_dim, **opts)
    new_v = torch.randn(num_tokens, m.num_key_value_heads, m.head_dim, **opts)
    write_index = torch.arange(num_tokens, device=q.device) * stride

    def save() -> Any:
        k_cache.index_copy_(0, write_index, new_k)
        v_cache.index_copy_(0, write_index, new_v)

    return save
