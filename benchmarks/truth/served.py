"""One vLLM server with the ``vllm`` backend's knobs, for benchmarks that drive it with other
clients (``vllm bench serve``, GuideLLM) and ours: on 127.0.0.1, in its own process group,
stopped by pid when the block ends."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from benchmarks.truth.bench_real_bench import _compose
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.core.engines.server import ManagedServer, free_loopback_port
from gpu_simulate_test.core.engines.vllm import VllmBackend
from gpu_simulate_test.core.engines.vllm_knobs import SNAPSHOTS, vllm_version
from gpu_simulate_test.core.model.modeling import ensure_snapshot


@dataclass(frozen=True)
class Served:
    """A running server: where it listens, the snapshot it serves, the real_bench overrides
    that point our client at it, and the cores a client should keep to."""

    base_url: str
    model_dir: Path
    overrides: tuple[str, ...]
    client_cpus: set[int] | None
    vllm_version: str


@contextlib.contextmanager
def served_vllm(root: Path, model: str = "qwen3_tiny") -> Iterator[Served]:
    """Start the ``vllm`` backend's server for ``model`` and yield it; always stop it."""
    port = free_loopback_port()
    base_url = f"http://127.0.0.1:{port}"
    overrides = (
        "backend=vllm",
        "backend.server.kind=external",
        f"backend.base_url={base_url}",
        f"model={model}",
        f"output.root={root}",
        "progress=false",
    )
    template = to_typed(
        _compose("real_bench", [*overrides, "workload_dir=unused"]), RealBenchStageConfig
    )
    backend = VllmBackend(template)
    model_dir = ensure_snapshot(template.model, Path("tmp") / SNAPSHOTS, backend.dtype).resolve()
    server = ManagedServer(
        backend.server_command(port, model_dir), root / "server.log", backend.server_env()
    )
    print(f"starting vLLM {vllm_version()} on {base_url} (log {root / 'server.log'})")
    server.start()
    try:
        startup = server.wait_healthy(f"{base_url}/health", 600)
        print(f"server healthy after {startup:.0f} s")
        yield Served(
            base_url, model_dir, overrides, backend.client_cpus(), vllm_version() or "unknown"
        )
    finally:
        server.stop()
