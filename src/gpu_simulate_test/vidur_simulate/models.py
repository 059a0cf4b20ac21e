"""Qwen3 models made known to Vidur: ``BaseModelConfig`` subclasses generated from our ModelConfig.

Vidur finds a model by ``BaseModelConfig.create_from_name(name)``, which walks *every* subclass,
calls its ``get_name()`` and instantiates the match with no arguments. So each generated class has
a ``get_name()`` and a default for every field, and defining it is what registers it. Classes are
created by :func:`register_qwen3_models` / :func:`vidur_model_name`, never at import.

Vidur has no ``head_dim``: ``ReplicaConfig`` derives ``embedding_dim // num_q_heads`` (64 for
Qwen3-0.6B, really 128). :func:`patch_head_dim` corrects the replica config afterwards.
"""

from __future__ import annotations

import dataclasses
from functools import cache
from typing import Any

from vidur.config.model_config import BaseModelConfig
from vidur.types import ActivationType, NormType

from gpu_simulate_test.config.presets import model_preset, preset_names
from gpu_simulate_test.config.schema import MODEL_DIMENSIONS, ConfigError, ModelConfig
from gpu_simulate_test.io.artifacts import stable_id

FAMILY_BASE_NAME = "gst/Qwen3-Config"
"""get_name() of the family base class (never simulated; every subclass must have a name)."""


def _vidur_name(model: ModelConfig) -> str:
    """The name Vidur knows a model under: its Hugging Face id, or ``gst/<name>``."""
    return model.hf_name or f"gst/{model.name.replace('_', '-')}"


@cache
def qwen3_family() -> dict[str, ModelConfig]:
    """The Qwen3 sizes we ship configs for (``gpu_simulate_test/configs/model/``), by the name
    Vidur knows them under; read on first use, never at import."""
    return {_vidur_name(model): model for model in map(model_preset, preset_names("model"))}


ARCHITECTURE_FIELDS: tuple[str, ...] = (
    *MODEL_DIMENSIONS,
    "rope_theta",
    "max_position_embeddings",
)
"""ModelConfig fields that decide the Vidur model (names and paths do not)."""


def vidur_fields(model: ModelConfig) -> dict[str, Any]:
    """Vidur's ``BaseModelConfig`` fields for a Qwen3 shape (plus our ``head_dim``)."""
    return {
        "num_layers": model.num_layers,
        "num_q_heads": model.num_attention_heads,
        "num_kv_heads": model.num_key_value_heads,
        "embedding_dim": model.hidden_size,
        "mlp_hidden_dim": model.intermediate_size,
        "max_model_len": model.max_position_embeddings,
        "use_gated_mlp": True,  # SwiGLU
        "use_bias": False,
        "use_qkv_bias": False,  # Qwen3 has q/k RMSNorm instead (not modelled by Vidur)
        "activation": ActivationType.SILU,
        "norm": NormType.RMS_NORM,
        "post_attn_norm": True,
        "vocab_size": model.vocab_size,
        "is_neox_style": True,
        "rope_theta": model.rope_theta,
        "rope_scaling": None,
        "partial_rotary_factor": 1.0,
        "no_tensor_parallel": False,
        "head_dim": model.head_dim,
    }


def _same_architecture(a: ModelConfig, b: ModelConfig) -> bool:
    return all(getattr(a, name) == getattr(b, name) for name in ARCHITECTURE_FIELDS)


@cache
def _family_base() -> type[BaseModelConfig]:
    return _make_class(
        "Qwen3ModelConfig", BaseModelConfig, FAMILY_BASE_NAME, qwen3_family()["gst/qwen3-tiny"]
    )


def _make_class(
    class_name: str, base: type[BaseModelConfig], vidur_name: str, model: ModelConfig
) -> type[BaseModelConfig]:
    """A dataclass subclass of ``base`` whose fields all default to ``model``'s numbers."""
    fields = [
        (key, type(value) if value is not None else Any, dataclasses.field(default=value))
        for key, value in vidur_fields(model).items()
    ]

    def get_name() -> str:
        return vidur_name

    cls = dataclasses.make_dataclass(
        class_name,
        fields,
        bases=(base,),
        namespace={"get_name": staticmethod(get_name), "__module__": __name__},
    )
    return cls


def _register(vidur_name: str, model: ModelConfig) -> str:
    from vidur.config.utils import get_all_subclasses

    classes = get_all_subclasses(BaseModelConfig)
    if any(cls.__module__ == __name__ and str(cls.get_name()) == vidur_name for cls in classes):
        return vidur_name
    if vidur_name in {str(cls.get_name()) for cls in classes}:
        raise ConfigError(
            f"Vidur already has a model named {vidur_name!r} that this toolkit did not create"
        )
    _model_class(vidur_name, model)
    return vidur_name


@cache
def _model_class(vidur_name: str, model: ModelConfig) -> type[BaseModelConfig]:
    """The class Vidur knows ``vidur_name`` by, made once.

    Vidur finds it by subclass walk (as :func:`_register` does), and ``__subclasses__`` holds
    classes weakly: this cache is what keeps it alive (no module-level registry).
    """
    class_name = "Qwen3_" + "".join(c if c.isalnum() else "_" for c in vidur_name.split("/")[-1])
    return _make_class(class_name, _family_base(), vidur_name, model)


def register_qwen3_models() -> list[str]:
    """Make the Qwen3 family known to Vidur (idempotent); returns their Vidur names."""
    return [_register(name, model) for name, model in qwen3_family().items()]


def vidur_model_name(model: ModelConfig) -> str:
    """The Vidur model name for ``model``, creating its class on first use.

    A shape of the shipped family keeps the family name (``Qwen/Qwen3-0.6B``); any other shape
    gets ``gst/<name>-<architecture hash>``, so two shapes never share a name.
    """
    if model.hidden_size % model.num_attention_heads:
        raise ConfigError(
            f"model.hidden_size ({model.hidden_size}) must be a multiple of "
            f"model.num_attention_heads ({model.num_attention_heads}) for Vidur"
        )
    register_qwen3_models()
    for name, family in qwen3_family().items():
        if _same_architecture(model, family):
            return name
    digest = stable_id({f: getattr(model, f) for f in ARCHITECTURE_FIELDS}, length=8)
    return _register(f"gst/{model.name}-{digest}", model)


def vidur_derived_head_dim(model: ModelConfig) -> int:
    """What Vidur assumes: hidden / heads."""
    return model.hidden_size // model.num_attention_heads


def patch_head_dim(replica_config: Any, model: ModelConfig) -> bool:
    """Set Vidur's ``_attention_head_dim`` to Qwen3's true head_dim; True when it changed.

    It feeds Vidur's parameter count, memory planner (memory-bound batch size) and MFU; attention
    *timing* comes from the profile and does not use it.
    """
    changed = bool(replica_config.attention_head_dim != model.head_dim)
    replica_config._attention_head_dim = model.head_dim
    return changed
