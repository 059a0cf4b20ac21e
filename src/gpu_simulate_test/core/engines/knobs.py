"""The real engine's knobs ↔ Vidur's scheduler knobs, so both sides model the same engine.

``hf_cb`` (transformers continuous batching) ↔ Vidur ``sarathi``: chunk_size =
max_num_batched_tokens, batch_size_cap = max_num_seqs, block_size = block_size, num_blocks =
num_gpu_blocks_override (the backend's knobs named as vLLM names them).
``vllm`` (V1 engine: chunked prefill, FCFS, running requests first, then waiting ones filling
the token budget, preemption by recompute) ↔ ``vllm_v1``, vLLM's own scheduler in our event loop
(:mod:`gpu_simulate_test.simulator.run`): chunk_size = ``--max-num-batched-tokens``,
batch_size_cap = ``--max-num-seqs``, block_size = ``--block-size``, num_blocks =
``--num-gpu-blocks-override``.
``vllm_engine`` is the same engine driven in-process, with the same knobs. ``hf_generate`` (one
request at a time, whole prompt in one prefill) ↔ ``sarathi`` with batch_size_cap = 1 and a
chunk as large as the longest prompt. ``openai`` serves from an engine we cannot see: the
configured Vidur knobs are used as given.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpu_simulate_test.config.backends import VllmEngineBackendConfig
from gpu_simulate_test.config.real_bench import BackendConfig
from gpu_simulate_test.config.renamed import current_names
from gpu_simulate_test.config.vidur import VidurSchedulerConfig

HF_CB_PAIRS: tuple[tuple[str, str], ...] = (
    ("max_num_batched_tokens", "chunk_size"),
    ("max_num_seqs", "batch_size_cap"),
    ("block_size", "block_size"),
    ("num_gpu_blocks_override", "num_blocks"),
)
"""(backend knob, Vidur scheduler knob) pairs that must be equal for hf_cb and vllm ↔ sarathi."""

CHUNKED_BACKENDS: tuple[str, ...] = ("hf_cb", "vllm", "vllm_engine")
"""Backends whose scheduler Vidur's sarathi mirrors knob for knob (:data:`HF_CB_PAIRS`)."""
VLLM_BACKENDS: tuple[str, ...] = ("vllm", "vllm_engine")
"""Backends running vLLM's engine (its server, or its engine in-process)."""


def derive_scheduler(
    backend: BackendConfig, base: VidurSchedulerConfig, max_prompt_tokens: int
) -> tuple[VidurSchedulerConfig, bool]:
    """The Vidur scheduler that mirrors ``backend``, and whether it was derived (not as given)."""
    if backend.name in CHUNKED_BACKENDS:
        values = {vidur: getattr(backend, real) for real, vidur in HF_CB_PAIRS}
        if isinstance(backend, VllmEngineBackendConfig):
            values["enable_prefix_caching"] = backend.enable_prefix_caching
            values["enable_chunked_prefill"] = backend.enable_chunked_prefill
        return dataclasses.replace(base, name=expected_scheduler(backend.name), **values), True
    if backend.name == "hf_generate":
        chunk = max(base.chunk_size, max_prompt_tokens)
        return (
            dataclasses.replace(base, name="sarathi", batch_size_cap=1, chunk_size=chunk),
            True,
        )
    return base, False


def expected_scheduler(backend: str) -> str:
    """The scheduler that mirrors a chunked backend: vLLM's own for vLLM, else Vidur's sarathi."""
    return "vllm_v1" if backend in VLLM_BACKENDS else "sarathi"


def knob_mismatches(
    backend: Mapping[str, Any], scheduler: Mapping[str, Any], num_blocks: int | None = None
) -> dict[str, tuple[Any, Any]]:
    """Knobs on which a real run's backend and a simulated run's scheduler model different engines.

    ``backend`` is the real run's ``config.backend`` (a record made before vLLM's names: read
    under today's, :func:`current_names`); ``scheduler`` the simulated run's ``scheduler``
    (``num_blocks`` the number Vidur actually used, when known).
    """
    backend = current_names(backend)
    name = backend.get("name")
    out: dict[str, tuple[Any, Any]] = {}
    if name in CHUNKED_BACKENDS:
        if scheduler.get("name") != expected_scheduler(str(name)):
            out["scheduler"] = (f"{name} (chunked prefill)", scheduler.get("name"))
        if name in VLLM_BACKENDS:
            real_on = bool(backend.get("enable_prefix_caching"))
            if real_on != bool(scheduler.get("enable_prefix_caching", False)):
                out["prefix caching"] = (_on(real_on), _on(not real_on))
            chunked = backend.get("enable_chunked_prefill")
            if chunked is not None and bool(chunked) != bool(
                scheduler.get("enable_chunked_prefill", True)
            ):
                out["chunked prefill"] = (_on(bool(chunked)), _on(not chunked))
        for real, vidur in HF_CB_PAIRS:
            sim_value = num_blocks if vidur == "num_blocks" and num_blocks else scheduler.get(vidur)
            if backend.get(real) is not None and backend.get(real) != sim_value:
                out[f"{real} ↔ {vidur}"] = (backend.get(real), sim_value)
    elif name == "hf_generate" and scheduler.get("batch_size_cap") != 1:
        out["batch_size_cap"] = (1, scheduler.get("batch_size_cap"))
    return out


def _on(flag: bool) -> str:
    return "on" if flag else "off"
