"""Shared by the in-process backends: building the model and describing it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.core.engines.records import BenchRequest
from gpu_simulate_test.core.model.device import check_device
from gpu_simulate_test.core.model.modeling import build_model, check_model_source, resolve_dtype


def check_in_process(cfg: RealBenchStageConfig, requests: Sequence[BenchRequest]) -> None:
    """What an in-process backend needs before anything starts: the configured device on this
    machine, a usable ``model.local_path`` when one is set, and token ids in the vocabulary."""
    check_device(cfg.hardware)
    check_model_source(cfg.model)
    for req in requests:
        if req.prompt_token_ids is None:
            raise ValueError(
                f"request {req.request_id} has no prompt_token_ids (in-process backends need them)"
            )
        if req.prompt_token_ids and max(req.prompt_token_ids) >= cfg.model.vocab_size:
            raise ValueError(
                f"request {req.request_id}: token id {max(req.prompt_token_ids)} is outside "
                f"model {cfg.model.name}'s vocabulary ({cfg.model.vocab_size})"
            )


def load_model(cfg: RealBenchStageConfig) -> Any:
    """The model on the configured device and dtype (snapshot weights or random init)."""
    return build_model(cfg.model, cfg.hardware.device, cfg.dtype, cfg.attn_implementation)


def describe_model(cfg: RealBenchStageConfig, model: Any) -> dict[str, Any]:
    """Device, dtype and attention kernel as the model actually has them."""
    return {
        "device": str(getattr(model, "device", cfg.hardware.device)),
        "dtype": str(getattr(model, "dtype", resolve_dtype(cfg.dtype, cfg.hardware.device))),
        "attn_implementation": getattr(model.config, "_attn_implementation", None),
        "weights": cfg.model.local_path or "random",
    }


def nvtx_module(cfg: RealBenchStageConfig) -> Any | None:
    """The ``nvtx`` module when NVTX ranges are wanted and can matter (CUDA), else None."""
    if not cfg.nvtx or not cfg.hardware.device.startswith("cuda"):
        return None
    try:
        import nvtx
    except ImportError:
        return None
    return nvtx


@contextlib.contextmanager
def nvtx_range(nvtx: Any | None, name: str) -> Iterator[None]:
    """An NVTX range when ``nvtx`` is given; nothing otherwise."""
    if nvtx is None:
        yield
        return
    handle = nvtx.start_range(message=name)
    try:
        yield
    finally:
        nvtx.end_range(handle)
