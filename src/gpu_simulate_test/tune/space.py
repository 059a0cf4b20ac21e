"""The tune's configurations: every combination of the space's knobs over the configured
backend, each checked against vLLM's own rules, and the one backend the calibration is made
with so that it covers them all."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpu_simulate_test.config.backends import VllmEngineBackendConfig
from gpu_simulate_test.config.schema import ConfigError, ModelConfig
from gpu_simulate_test.config.tune import TUNE_KNOBS, TuneOptions

SHORT: Mapping[str, str] = MappingProxyType(
    {
        "max_num_seqs": "s",
        "max_num_batched_tokens": "t",
        "num_gpu_blocks": "b",
    }
)
"""A configuration's id names each varied number knob by a letter and its value (``s8-t128``);
a varied switch is ``chunk``/``nochunk``, ``pc``/``nopc``."""
SWITCHES: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "enable_chunked_prefill": ("chunk", "nochunk"),
        "enable_prefix_caching": ("pc", "nopc"),
    }
)
TUNE_KNOBS_ORDER: tuple[str, ...] = tuple(TUNE_KNOBS)
"""The knobs in the order the table lists them."""
CONFIGURED_ID = "configured"
"""The id of the configured backend when the space does not contain it."""


@dataclass(frozen=True)
class Candidate:
    """One configuration of the engine."""

    config_id: str
    knobs: Mapping[str, Any]
    """Every knob of :data:`TUNE_KNOBS`, by ``vllm serve``'s name."""
    backend: VllmEngineBackendConfig
    configured: bool
    """The backend as configured (``backend.*``): the baseline every report sets the rest
    beside."""
    invalid: str = ""
    """Why vLLM would refuse it (empty: it runs)."""


def knobs_of(backend: VllmEngineBackendConfig) -> dict[str, Any]:
    """The tune's knobs as ``backend`` sets them."""
    return {name: getattr(backend, field) for name, field in TUNE_KNOBS.items()}


def with_knobs(backend: VllmEngineBackendConfig, knobs: Mapping[str, Any]) -> Any:
    """``backend`` with the tune's ``knobs`` (by ``vllm serve``'s names) set."""
    return dataclasses.replace(backend, **{TUNE_KNOBS[name]: v for name, v in knobs.items()})


def config_id(knobs: Mapping[str, Any], varied: tuple[str, ...]) -> str:
    parts = []
    for name in varied:
        if name in SWITCHES:
            parts.append(SWITCHES[name][0] if knobs[name] else SWITCHES[name][1])
        else:
            parts.append(f"{SHORT[name]}{knobs[name]}")
    return "-".join(parts)


def max_model_len(backend: VllmEngineBackendConfig, model: ModelConfig) -> int:
    """vLLM's max_model_len for ``backend`` as the served engine is given it
    (``backend.max_model_len``, or the longest sequence the model and the KV cache hold)."""
    if backend.max_model_len:
        return int(backend.max_model_len)
    cache = (backend.num_blocks - 1) * backend.block_size if backend.num_blocks > 1 else 0
    return min(model.max_position_embeddings, cache) if cache else model.max_position_embeddings


def refusal(backend: VllmEngineBackendConfig, model: ModelConfig, longest: int) -> str:
    """Why vLLM 0.32 would refuse this configuration, or this workload on it (empty: neither);
    the rules of its ``SchedulerConfig.verify_max_model_len``."""
    tokens, seqs = backend.max_batch_tokens, backend.max_requests_per_batch
    limit = max_model_len(backend, model)
    if tokens < seqs:
        return f"max_num_batched_tokens ({tokens}) must be >= max_num_seqs ({seqs})"
    if not backend.enable_chunked_prefill and tokens < limit:
        return (
            f"without chunked prefill max_num_batched_tokens ({tokens}) must be >= "
            f"max_model_len ({limit}; set backend.max_model_len to lower it)"
        )
    if longest > limit:
        return f"the workload's longest request ({longest} tokens) is over max_model_len ({limit})"
    return ""


def candidates(
    opts: TuneOptions, backend: Any, model: ModelConfig, longest: int
) -> list[Candidate]:
    """Every combination of the space over ``backend`` (the space's order: the last knob varies
    fastest), and the configured backend last when the space does not contain it."""
    space = opts.knobs()
    varied = tuple(name for name in TUNE_KNOBS if name in space)
    base = knobs_of(backend)
    found: list[Candidate] = []
    for values in itertools.product(*space.values()):
        knobs = {**base, **dict(zip(space, values, strict=True))}
        engine = with_knobs(backend, knobs)
        found.append(
            Candidate(
                config_id(knobs, varied),
                knobs,
                engine,
                knobs == base,
                refusal(engine, model, longest),
            )
        )
    if not any(c.configured for c in found):
        found.append(
            Candidate(CONFIGURED_ID, base, backend, True, refusal(backend, model, longest))
        )
    if all(c.invalid for c in found):
        raise ConfigError(
            "tune.space: vLLM would refuse every configuration, e.g. "
            f"{found[0].config_id}: {found[0].invalid}"
        )
    return found


def calibration_backend(found: list[Candidate]) -> Any:
    """The one backend the profile and the engine calibration are made with: the largest token
    budget, request cap and KV cache of the space (so that its experiments and ranges cover
    every configuration's steps), prefix caching on if any configuration has it (its cached
    prefills then calibrated too), chunked prefill on if any has it."""
    valid = [c for c in found if not c.invalid]
    first = next((c.backend for c in valid if c.configured), valid[0].backend)
    return dataclasses.replace(
        first,
        max_batch_tokens=max(c.backend.max_batch_tokens for c in valid),
        max_requests_per_batch=max(c.backend.max_requests_per_batch for c in valid),
        num_blocks=max(c.backend.num_blocks for c in valid),
        enable_prefix_caching=any(c.backend.enable_prefix_caching for c in valid),
        enable_chunked_prefill=any(c.backend.enable_chunked_prefill for c in valid),
    )


def serve_flags(knobs: Mapping[str, Any]) -> list[str]:
    """``vllm serve`` flags for a configuration's knobs."""
    flags = [
        f"--max-num-seqs {knobs['max_num_seqs']}",
        f"--max-num-batched-tokens {knobs['max_num_batched_tokens']}",
        f"--num-gpu-blocks-override {knobs['num_gpu_blocks']}",
    ]
    for name, flag in (
        ("enable_chunked_prefill", "enable-chunked-prefill"),
        ("enable_prefix_caching", "enable-prefix-caching"),
    ):
        flags.append(f"--{flag}" if knobs[name] else f"--no-{flag}")
    return flags
