"""The interface every real-bench backend implements, and the errors it raises."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder


class BackendError(RuntimeError):
    """The engine or server failed while the run was going (the run is marked failed)."""


class Backend(ABC):
    """A serving engine the harness replays requests against.

    Lifecycle, driven by the harness: ``check`` (before the run exists; raise ValueError for bad
    input) → ``start`` (load the model or connect) → ``warmup`` → ``submit`` once per request at its
    arrival time, with results reported to the recorder from the backend's own threads → ``close``
    (always called, also after an error or Ctrl-C). ``submit`` must return at once.
    """

    name: ClassVar[str]
    in_process: ClassVar[bool] = True
    """Runs the model in this process (the harness lowers the GIL switch interval then)."""
    api_server: ClassVar[bool] = False
    """Reaches its engine through an API server (HTTP): the client's stamps and the engine's
    then straddle that server, so only its own stamps split a first token (compare's
    ``ttft_parts``); without one the request table's stamps do."""
    serves_sessions: ClassVar[bool] = False
    """Runs a multi-turn workload's sessions (:mod:`.closed_loop`): its streams report the output
    token ids (``Recorder.finish(output_token_ids=...)``) a later turn's prompt is built from."""

    def __init__(self, cfg: RealBenchStageConfig) -> None:
        self.cfg = cfg
        self.log_dir: Path | None = None
        """Where a started server writes its log (the run directory; a temporary one if None)."""

    def check(self, requests: Sequence[BenchRequest]) -> None:  # noqa: B027 - optional hook
        """Fail with ValueError, before anything starts, on requests this backend cannot serve."""

    @abstractmethod
    def start(self, recorder: Recorder) -> None:
        """Load the model or connect to the server; results go to ``recorder``."""

    @abstractmethod
    def warmup(self, requests: Sequence[BenchRequest]) -> None:
        """Serve ``requests`` to completion, outside the measurement."""

    @abstractmethod
    def submit(self, request: BenchRequest) -> None:
        """Hand one request to the engine, now, without waiting for it."""

    def cancel(self, request_id: int) -> None:  # noqa: B027 - optional hook
        """Stop working on a request (timed out); best effort."""

    @abstractmethod
    def failure(self) -> str | None:
        """Why the engine or server is dead, or None while it is alive."""

    @abstractmethod
    def close(self, abort: bool = False) -> None:
        """Stop the engine (``abort``: drop in-flight work) and release it; idempotent."""

    def sizes_run(self) -> frozenset[int]:
        """The step sizes (tokens) the engine is known to have run since it started: a shape
        warm-up of these would pay no one-time cost again; none known by default."""
        return frozenset()

    def client_cpus(self) -> set[int] | None:
        """The cores the client should keep to during the replay, so that it neither steals the
        engine's cores nor waits for them (None: wherever the OS puts it)."""
        return None

    def write_artifacts(self, run_dir: Path, origin: float, since: float) -> dict[str, Any]:
        """Write what the engine itself recorded (its step log, its counters) into ``run_dir``;
        ``origin`` is the run clock's zero and ``since`` the replay's start (``perf_counter``).
        Returns what ``run_meta.json`` should say of it."""
        return {}

    def describe(self) -> dict[str, Any]:
        """The backend's resolved knobs, device, dtype, attention kernel: for ``run_meta.json``."""
        return {"name": self.name}
