"""Analytic parameter counts, FLOPs and bytes moved of a Qwen3 decoder, and their roofline time.

Pure functions over :class:`ModelConfig` (and :class:`HardwareConfig` for the roofline). One
forward step is described by how many *new* tokens each sequence processes and how many tokens
were already in its KV cache:

* prefill of a prompt of ``P`` tokens: ``new_tokens=P``, ``cached_tokens=0``; attention is causal,
  so query ``i`` (1-based) sees ``i`` keys and a sequence has ``P(P+1)/2`` (query, key) pairs,
  about half of the ``P²`` a non-causal product would do (the "causal halving").
* decode with ``C`` tokens already cached: ``new_tokens=1``, ``cached_tokens=C``; the new token
  attends to ``C + 1`` keys (the cache plus itself).

A matmul of ``[M, K] x [K, N]`` costs ``2·M·K·N`` FLOPs. Bytes moved assume each weight is read
once per step, each op reads its inputs and writes its outputs once (no fusion, no cache reuse),
and attention is a fused (flash-style) kernel that never writes the score matrix. The formulas,
with the constants for element-wise ops, are in ``docs/static_analysis.md``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any, Literal

from gpu_simulate_test.config.schema import HardwareConfig, ModelConfig

OpKind = Literal["matmul", "attention", "norm", "elementwise", "memory"]
Phase = Literal["prefill", "decode"]
LmHeadTokens = Literal["last", "all"]

DTYPE_BYTES: Mapping[str, int] = MappingProxyType(
    {"float32": 4, "bfloat16": 2, "float16": 2, "float8": 1}
)
"""Bytes per element of the dtypes the toolkit computes in."""

RMSNORM_FLOPS_PER_ELEMENT = 4
"""square, accumulate, scale by 1/rms, scale by the weight."""
SWIGLU_ACT_FLOPS_PER_ELEMENT = 5
"""silu(gate) = gate·sigmoid(gate) (exp, add, divide, multiply) times ``up`` (one multiply)."""
RESIDUAL_FLOPS_PER_ELEMENT = 1


@dataclass(frozen=True)
class OpCost:
    """One operator of a forward step: its parameters, FLOPs and bytes moved (whole batch)."""

    name: str
    kind: OpKind
    params: int
    flops: int
    bytes_moved: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sum(ops: tuple[OpCost, ...], field: str, kinds: tuple[str, ...] | None = None) -> int:
    return sum(int(getattr(op, field)) for op in ops if kinds is None or op.kind in kinds)


@dataclass(frozen=True)
class LayerCost:
    """The ops of one decoder layer (every Qwen3 layer is identical)."""

    ops: tuple[OpCost, ...]

    @property
    def params(self) -> int:
        return _sum(self.ops, "params")

    @property
    def flops(self) -> int:
        return _sum(self.ops, "flops")

    @property
    def matmul_flops(self) -> int:
        """Projection, MLP and attention-product FLOPs (what a matmul FLOP counter sees)."""
        return _sum(self.ops, "flops", ("matmul", "attention"))

    @property
    def bytes_moved(self) -> int:
        return _sum(self.ops, "bytes_moved")

    def op(self, name: str) -> OpCost:
        """The op called ``name``; KeyError lists the names there are."""
        for candidate in self.ops:
            if candidate.name == name:
                return candidate
        raise KeyError(f"no op {name!r}; ops: {', '.join(o.name for o in self.ops)}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "params": self.params,
            "flops": self.flops,
            "matmul_flops": self.matmul_flops,
            "bytes_moved": self.bytes_moved,
            "ops": [op.to_dict() for op in self.ops],
        }


@dataclass(frozen=True)
class ParameterCount:
    """Parameters by component; tied embeddings are counted once (in ``embedding``)."""

    attention_per_layer: int
    mlp_per_layer: int
    norms_per_layer: int
    num_layers: int
    embedding: int
    final_norm: int
    lm_head: int
    """0 when the LM head is tied to the embedding."""

    @property
    def per_layer(self) -> int:
        return self.attention_per_layer + self.mlp_per_layer + self.norms_per_layer

    @property
    def total(self) -> int:
        return self.num_layers * self.per_layer + self.embedding + self.final_norm + self.lm_head

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "per_layer": self.per_layer, "total": self.total}


@dataclass(frozen=True)
class ModelCost:
    """FLOPs and bytes of one forward step of the whole model for a batch of sequences."""

    model_name: str
    phase: Phase
    batch_size: int
    new_tokens: int
    """Tokens each sequence processes in this step (prompt length, or 1 for decode)."""
    cached_tokens: int
    """Tokens already in each sequence's KV cache before the step."""
    dtype_bytes: int
    num_layers: int
    layer: LayerCost
    outer_ops: tuple[OpCost, ...]
    """Embedding lookup, final norm and LM head."""

    @property
    def ops(self) -> tuple[OpCost, ...]:
        """Every op once, layer ops scaled by the number of layers."""
        scaled = tuple(
            OpCost(
                f"layers.{op.name}",
                op.kind,
                op.params * self.num_layers,
                op.flops * self.num_layers,
                op.bytes_moved * self.num_layers,
            )
            for op in self.layer.ops
        )
        return (*scaled, *self.outer_ops)

    @property
    def params(self) -> int:
        return _sum(self.ops, "params")

    @property
    def flops(self) -> int:
        return _sum(self.ops, "flops")

    @property
    def matmul_flops(self) -> int:
        return _sum(self.ops, "flops", ("matmul", "attention"))

    @property
    def attention_flops(self) -> int:
        """QKᵀ and PV products only (causal halving applied for prefill)."""
        return _sum(self.ops, "flops", ("attention",))

    @property
    def bytes_moved(self) -> int:
        return _sum(self.ops, "bytes_moved")

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved."""
        return arithmetic_intensity(self.flops, self.bytes_moved)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "phase": self.phase,
            "batch_size": self.batch_size,
            "new_tokens": self.new_tokens,
            "cached_tokens": self.cached_tokens,
            "dtype_bytes": self.dtype_bytes,
            "num_layers": self.num_layers,
            "params": self.params,
            "flops": self.flops,
            "matmul_flops": self.matmul_flops,
            "attention_flops": self.attention_flops,
            "bytes_moved": self.bytes_moved,
            "arithmetic_intensity_flop_per_byte": self.arithmetic_intensity,
            "layer": self.layer.to_dict(),
            "outer_ops": [op.to_dict() for op in self.outer_ops],
        }


@dataclass(frozen=True)
class RooflineEstimate:
    """Lower bound on a step's time on a device: max(FLOPs / peak, bytes / bandwidth)."""

    hardware_name: str
    flops: int
    bytes_moved: int
    arithmetic_intensity_flop_per_byte: float
    ridge_point_flop_per_byte: float
    """peak FLOP/s ÷ bandwidth B/s: intensities above it are compute-bound."""
    compute_time_s: float
    memory_time_s: float
    bound_time_s: float
    bound: Literal["compute", "memory"]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (``bfloat16`` → 2); ValueError names the known dtypes."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype={dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


def arithmetic_intensity(flops: float, bytes_moved: float) -> float:
    """FLOPs per byte; inf when nothing is moved."""
    return float("inf") if bytes_moved == 0 else flops / bytes_moved


def parameter_counts(model: ModelConfig) -> ParameterCount:
    """Parameters of a Qwen3 decoder (no biases; q_norm/k_norm over head_dim in each layer)."""
    h, d = model.hidden_size, model.head_dim
    q_out, kv_out = model.num_attention_heads * d, model.num_key_value_heads * d
    attention = h * q_out + 2 * h * kv_out + q_out * h
    mlp = 3 * h * model.intermediate_size
    norms = 2 * h + 2 * d  # input + post-attention RMSNorm, q_norm + k_norm
    embedding = model.vocab_size * h
    return ParameterCount(
        attention_per_layer=attention,
        mlp_per_layer=mlp,
        norms_per_layer=norms,
        num_layers=model.num_layers,
        embedding=embedding,
        final_norm=h,
        lm_head=0 if model.tie_word_embeddings else embedding,
    )


def kv_cache_bytes_per_token(model: ModelConfig, dtype: str = "bfloat16") -> int:
    """KV-cache bytes one token occupies: K and V, every layer, kv heads × the real head_dim."""
    return 2 * model.num_layers * model.num_key_value_heads * model.head_dim * dtype_bytes(dtype)


def attention_pairs(new_tokens: int, cached_tokens: int) -> int:
    """(query, key) pairs of one sequence under a causal mask.

    Query ``i`` of ``n`` new tokens (1-based) sees ``cached + i`` keys, so the sum is
    ``n·cached + n(n+1)/2``: ``P(P+1)/2`` for a fresh prompt, ``C + 1`` for one decode token.
    """
    return new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2


def _linear(name: str, tokens: int, d_in: int, d_out: int, b: int) -> OpCost:
    return OpCost(
        name,
        "matmul",
        params=d_in * d_out,
        flops=2 * tokens * d_in * d_out,
        bytes_moved=b * (d_in * d_out + tokens * d_in + tokens * d_out),
    )


def _rmsnorm(name: str, rows: int, width: int, b: int) -> OpCost:
    return OpCost(
        name,
        "norm",
        params=width,
        flops=RMSNORM_FLOPS_PER_ELEMENT * rows * width,
        bytes_moved=b * (2 * rows * width + width),
    )


def layer_cost(
    model: ModelConfig, *, batch_size: int, new_tokens: int, cached_tokens: int, dtype: str
) -> LayerCost:
    """Ops of one decoder layer for ``batch_size`` sequences in the same state."""
    _check_positive(batch_size=batch_size, new_tokens=new_tokens)
    if cached_tokens < 0:
        raise ValueError(f"cached_tokens must be >= 0, got {cached_tokens}")
    b = dtype_bytes(dtype)
    h, d, inter = model.hidden_size, model.head_dim, model.intermediate_size
    heads, kv_heads = model.num_attention_heads, model.num_key_value_heads
    tokens = batch_size * new_tokens
    keys = cached_tokens + new_tokens  # keys each sequence reads from the cache after the write
    pairs = batch_size * attention_pairs(new_tokens, cached_tokens)
    q_elems, kv_new_elems = tokens * heads * d, tokens * kv_heads * d
    kv_read_elems = batch_size * keys * kv_heads * d
    ops = (
        _rmsnorm("input_norm", tokens, h, b),
        _linear("q_proj", tokens, h, heads * d, b),
        _linear("k_proj", tokens, h, kv_heads * d, b),
        _linear("v_proj", tokens, h, kv_heads * d, b),
        _rmsnorm("q_norm", tokens * heads, d, b),
        _rmsnorm("k_norm", tokens * kv_heads, d, b),
        OpCost("kv_cache_write", "memory", 0, 0, b * 2 * kv_new_elems),
        # scores S = Q Kᵀ: every query head multiplies its d-vector with each visible key
        OpCost("attn_scores", "attention", 0, 2 * heads * d * pairs, b * (q_elems + kv_read_elems)),
        # output O = P V: the same pairs, reading V and writing O
        OpCost("attn_values", "attention", 0, 2 * heads * d * pairs, b * (kv_read_elems + q_elems)),
        _linear("o_proj", tokens, heads * d, h, b),
        OpCost("attn_residual", "elementwise", 0, tokens * h, b * 3 * tokens * h),
        _rmsnorm("post_attention_norm", tokens, h, b),
        _linear("gate_proj", tokens, h, inter, b),
        _linear("up_proj", tokens, h, inter, b),
        OpCost(
            "swiglu_act",
            "elementwise",
            0,
            SWIGLU_ACT_FLOPS_PER_ELEMENT * tokens * inter,
            b * 3 * tokens * inter,
        ),
        _linear("down_proj", tokens, inter, h, b),
        OpCost("mlp_residual", "elementwise", 0, tokens * h, b * 3 * tokens * h),
    )
    return LayerCost(ops)


def _check_positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def step_cost(
    model: ModelConfig,
    *,
    phase: Phase,
    batch_size: int,
    new_tokens: int,
    cached_tokens: int,
    dtype: str = "bfloat16",
    lm_head_tokens: LmHeadTokens = "last",
) -> ModelCost:
    """Whole-model cost of one forward step (see the module docstring for the step shapes).

    ``lm_head_tokens="last"`` computes logits only for each sequence's last position (what
    serving engines and ``generate`` do); ``"all"`` for every new token (a plain forward).
    """
    b = dtype_bytes(dtype)
    h, vocab = model.hidden_size, model.vocab_size
    layer = layer_cost(
        model,
        batch_size=batch_size,
        new_tokens=new_tokens,
        cached_tokens=cached_tokens,
        dtype=dtype,
    )
    tokens = batch_size * new_tokens
    logit_rows = batch_size if lm_head_tokens == "last" else tokens
    counts = parameter_counts(model)
    lm_head = _linear("lm_head", logit_rows, h, vocab, b)
    outer = (
        # a gather: reads one row per token and writes it; the table itself is not streamed
        OpCost("embedding", "memory", counts.embedding, 0, b * 2 * tokens * h),
        _rmsnorm("final_norm", logit_rows, h, b),
        OpCost("lm_head", "matmul", counts.lm_head, lm_head.flops, lm_head.bytes_moved),
    )
    return ModelCost(
        model_name=model.name,
        phase=phase,
        batch_size=batch_size,
        new_tokens=new_tokens,
        cached_tokens=cached_tokens,
        dtype_bytes=b,
        num_layers=model.num_layers,
        layer=layer,
        outer_ops=outer,
    )


def prefill_cost(
    model: ModelConfig,
    prompt_len: int,
    batch_size: int = 1,
    dtype: str = "bfloat16",
    lm_head_tokens: LmHeadTokens = "last",
) -> ModelCost:
    """Prefill of ``batch_size`` prompts of ``prompt_len`` tokens each (causal attention)."""
    _check_positive(prompt_len=prompt_len)
    return step_cost(
        model,
        phase="prefill",
        batch_size=batch_size,
        new_tokens=prompt_len,
        cached_tokens=0,
        dtype=dtype,
        lm_head_tokens=lm_head_tokens,
    )


def decode_cost(
    model: ModelConfig, context_len: int, batch_size: int = 1, dtype: str = "bfloat16"
) -> ModelCost:
    """One decode step of ``batch_size`` sequences, each with ``context_len`` tokens cached."""
    if context_len < 0:
        raise ValueError(f"context_len must be >= 0, got {context_len}")
    return step_cost(
        model,
        phase="decode",
        batch_size=batch_size,
        new_tokens=1,
        cached_tokens=context_len,
        dtype=dtype,
    )


def roofline(flops: float, bytes_moved: float, hardware: HardwareConfig) -> RooflineEstimate:
    """Roofline-bound time on ``hardware`` (dense bf16 peak, HBM bandwidth)."""
    peak_flop_s = hardware.peak_bf16_tflops * 1e12
    bandwidth_b_s = hardware.memory_bandwidth_gb_s * 1e9
    compute_s, memory_s = flops / peak_flop_s, bytes_moved / bandwidth_b_s
    return RooflineEstimate(
        hardware_name=hardware.name,
        flops=int(flops),
        bytes_moved=int(bytes_moved),
        arithmetic_intensity_flop_per_byte=arithmetic_intensity(flops, bytes_moved),
        ridge_point_flop_per_byte=peak_flop_s / bandwidth_b_s,
        compute_time_s=compute_s,
        memory_time_s=memory_s,
        bound_time_s=max(compute_s, memory_s),
        bound="compute" if compute_s >= memory_s else "memory",
    )


def step_roofline(cost: ModelCost, hardware: HardwareConfig) -> RooflineEstimate:
    """:func:`roofline` of a whole forward step."""
    return roofline(cost.flops, cost.bytes_moved, hardware)


def cost_table(
    model: ModelConfig,
    hardware: HardwareConfig,
    *,
    prompt_lens: tuple[int, ...] = (),
    context_lens: tuple[int, ...] = (),
    batch_sizes: tuple[int, ...] = (1,),
    dtype: str = "bfloat16",
) -> list[dict[str, Any]]:
    """One flat row per (phase, length, batch): totals and the roofline, for a table or CSV."""
    rows: list[dict[str, Any]] = []
    costs = [prefill_cost(model, p, batch, dtype) for batch in batch_sizes for p in prompt_lens] + [
        decode_cost(model, c, batch, dtype) for batch in batch_sizes for c in context_lens
    ]
    for cost in costs:
        est = step_roofline(cost, hardware)
        rows.append(
            {
                "model": cost.model_name,
                "hardware": hardware.name,
                "phase": cost.phase,
                "batch_size": cost.batch_size,
                "new_tokens": cost.new_tokens,
                "cached_tokens": cost.cached_tokens,
                "flops": cost.flops,
                "bytes_moved": cost.bytes_moved,
                "arithmetic_intensity_flop_per_byte": est.arithmetic_intensity_flop_per_byte,
                "compute_time_s": est.compute_time_s,
                "memory_time_s": est.memory_time_s,
                "bound_time_s": est.bound_time_s,
                "bound": est.bound,
            }
        )
    return rows
