"""The engines we drive (vLLM, transformers), one file each, behind a registry keyed by
``backend.name``; with the replay harness, the server process and vLLM's step log. Used by the
real bench, the engine calibration and the deep profile."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from gpu_simulate_test.config.real_bench import BACKEND_NAMES, RealBenchStageConfig
from gpu_simulate_test.core.engines.base import Backend, BackendError
from gpu_simulate_test.core.engines.hf_cb import HfContinuousBatchingBackend
from gpu_simulate_test.core.engines.hf_generate import HfGenerateBackend
from gpu_simulate_test.core.engines.openai import OpenAIBackend
from gpu_simulate_test.core.engines.vllm import VllmBackend
from gpu_simulate_test.core.engines.vllm_engine import VllmEngineBackend

BACKENDS: Mapping[str, type[Backend]] = MappingProxyType(
    {
        HfContinuousBatchingBackend.name: HfContinuousBatchingBackend,
        HfGenerateBackend.name: HfGenerateBackend,
        OpenAIBackend.name: OpenAIBackend,
        VllmBackend.name: VllmBackend,
        VllmEngineBackend.name: VllmEngineBackend,
    }
)
"""``backend.name`` → implementation."""

assert tuple(sorted(BACKENDS)) == tuple(sorted(BACKEND_NAMES)), "registry out of sync with config"


def get_backend(name: str) -> type[Backend]:
    """The backend class registered under ``name``; ValueError listing the known ones otherwise."""
    try:
        return BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown backend {name!r}; backends are {', '.join(BACKENDS)}") from None


def make_backend(
    cfg: RealBenchStageConfig, cls: type[Backend] | None = None, *, calibrating: bool = False
) -> Backend:
    """The backend that serves ``cfg``: ``cls`` (default: the one registered under
    ``backend.name``), or for ``backend=vllm backend.servers=N`` (N > 1) a fleet of N servers
    behind the client's router (:class:`~.vllm_fleet.VllmFleetBackend`); ``calibrating``, the
    fleet's servers with every request sent to each, the first timed
    (:class:`~.vllm_neighbours.VllmNeighboursBackend`)."""
    if int(getattr(cfg.backend, "servers", 1)) > 1:
        from gpu_simulate_test.core.engines.vllm_fleet import VllmFleetBackend
        from gpu_simulate_test.core.engines.vllm_neighbours import VllmNeighboursBackend

        return VllmNeighboursBackend(cfg) if calibrating else VllmFleetBackend(cfg)
    return (cls or get_backend(cfg.backend.name))(cfg)


def check_serves_sessions(backend: type[Backend], num_sessions: int) -> None:
    """ValueError, one line naming ``backend.name``, when ``backend`` cannot run a multi-turn
    workload's ``num_sessions`` sessions (:attr:`Backend.serves_sessions`)."""
    if backend.serves_sessions:
        return
    name = backend.name
    able = " or ".join(f"backend={n}" for n, cls in BACKENDS.items() if cls.serves_sessions)
    raise ValueError(
        f"backend.name={name} cannot run a multi-turn workload ({num_sessions} sessions): a turn "
        ">= 1 is sent think_time_s after the previous turn's last token, its prompt built from "
        f"the output token ids the server returned; {able} runs sessions (a vLLM server, started "
        "here or backend.server.kind=external)"
    )


__all__ = (
    "BACKENDS",
    "Backend",
    "BackendError",
    "check_serves_sessions",
    "get_backend",
    "make_backend",
)
