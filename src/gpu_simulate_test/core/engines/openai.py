"""``openai``: an OpenAI-compatible streaming client (``/v1/completions``, SSE).

For a server the user runs (vLLM, SGLang, ``transformers serve``: ``server.kind=external``) or
one this backend starts on 127.0.0.1 and stops by pid (``server.kind=transformers_serve``).
Every SSE event is stamped when it arrives; output tokens are counted from ``usage`` (asked for
with ``stream_options.include_usage``), and a mismatch between events and the count is flagged
in ``request_metrics.csv`` (``token_count_mismatch``): a chunk may carry several tokens, or none.
The same usage gives the prompt tokens the server's prefix cache held, where it reports them
(``prompt_tokens_details.cached_tokens``: ``cached_tokens``).

Exact output lengths: ``ignore_eos`` for vLLM/SGLang; ``transformers serve`` rejects it but
honours ``generation_config='{"max_new_tokens": N, "eos_token_id": -1}'``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from gpu_simulate_test.config.backends import HttpBackendConfig, OpenAIBackendConfig, as_engine
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.core.engines.base import Backend, BackendError
from gpu_simulate_test.core.engines.engine_clock import wall_offset_s
from gpu_simulate_test.core.engines.records import (
    STATUS_ERROR,
    STATUS_OK,
    BenchRequest,
    Recorder,
)
from gpu_simulate_test.core.engines.server import (
    LineHook,
    ManagedServer,
    ServerError,
    start_on_loopback,
)
from gpu_simulate_test.core.engines.stream_loop import StreamLoop

CONNECT_TIMEOUT_S = 5.0
SERVER_LOG = "server.log"
"""A started server's log, in the run directory."""


def parse_sse_line(line: str) -> dict[str, Any] | None:
    """The JSON payload of one ``data:`` line; None for blank lines, comments and ``[DONE]``."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if not data or data == "[DONE]":
        return None
    payload = json.loads(data)
    return payload if isinstance(payload, dict) else None


def event_tokens(choice: dict[str, Any]) -> int:
    """Tokens one streamed choice carries: its ``token_ids`` where the server returns them
    (vLLM's ``return_token_ids``; one chunk may carry several), else one per non-empty text."""
    ids = choice.get("token_ids")
    if isinstance(ids, list):
        return len(ids)
    return 1 if choice.get("text") else 0


class OutputIds:
    """The output token ids of one stream, chunk by chunk (vLLM's ``return_token_ids``): what a
    multi-turn session's next prompt continues from (:mod:`.closed_loop`)."""

    def __init__(self) -> None:
        self.ids: list[int] | None = None
        """None until a chunk carried ``token_ids`` (a server that returns none)."""

    def add(self, choice: Mapping[str, Any]) -> None:
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            if self.ids is None:
                self.ids = []
            self.ids.extend(int(t) for t in ids)


def read_usage(usage: Mapping[str, Any]) -> tuple[int, int | None]:
    """Output tokens (``completion_tokens``) and prompt tokens served from the prefix cache
    (``prompt_tokens_details.cached_tokens``; None where absent: vLLM sends it only with
    ``--enable-prompt-tokens-details``) of a usage object (the stream's final usage chunk)."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, Mapping) else None
    return int(usage.get("completion_tokens") or 0), int(cached) if cached is not None else None


class StreamReader:
    """One streamed completion read line by line, the same for the sync and the async client:
    its events into the recorder (None: a warm-up, nothing recorded), the usage's output and
    cached tokens, and its output ids; :meth:`finish_ok` closes it."""

    def __init__(self, request_id: int, recorder: Recorder | None) -> None:
        self.request_id = request_id
        self.recorder = recorder
        self.usage: int | None = None
        self.cached: int | None = None
        self.output = OutputIds()

    def line(self, line: str, now: float) -> None:
        """One SSE line, read at ``now``; BackendError on a server error in the stream."""
        payload = parse_sse_line(line)
        if payload is None:
            return
        if "error" in payload:
            raise BackendError(f"server error: {payload['error']}")
        if payload.get("usage"):
            self.usage, self.cached = read_usage(payload["usage"])
        choices = payload.get("choices") or []
        if choices and self.recorder is not None:
            self.recorder.tokens(self.request_id, now, event_tokens(choices[0]))
            self.output.add(choices[0])

    def finish_ok(self) -> None:
        if self.recorder is not None:
            self.recorder.finish(
                self.request_id,
                STATUS_OK,
                reported_decode_tokens=self.usage,
                cached_tokens=self.cached,
                output_token_ids=self.output.ids,
            )


KEEPALIVE_EXPIRY_S = 2.0
"""How long an idle connection is kept for reuse: under the servers' 5 s keep-alive timeout."""


class SenderPool:
    """Threads that each send one request at a time, started ahead of need: a send is a queue
    put. A thread that takes a request starts a new spare when fewer than :attr:`spare` are
    idle, so any number of requests can be in flight and the caller never starts a thread."""

    def __init__(self, send: Callable[[BenchRequest], None], spare: int = 8) -> None:
        self.send = send
        self.spare = spare
        self._jobs: queue.SimpleQueue[BenchRequest | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for _ in range(self.spare):
            self._spawn()

    def _spawn(self) -> None:
        with self._lock:
            self._idle += 1
            thread = threading.Thread(target=self._run, name="sender", daemon=True)
            self._threads.append(thread)
        thread.start()

    def _run(self) -> None:
        while (req := self._jobs.get()) is not None:
            with self._lock:
                self._idle -= 1
                short = self._idle < self.spare
            if short:
                self._spawn()
            try:
                self.send(req)
            finally:
                with self._lock:
                    self._idle += 1

    def put(self, request: BenchRequest) -> None:
        self._jobs.put(request)

    def stop(self) -> None:
        """Let every thread finish its request and end (they are daemons: none blocks exit)."""
        with self._lock:
            count = len(self._threads)
        for _ in range(count):
            self._jobs.put(None)


class OpenAIBackend(Backend):
    """Streaming ``/v1/completions`` requests, each on a sender thread, to a server."""

    name: ClassVar[str] = "openai"
    in_process: ClassVar[bool] = False
    api_server: ClassVar[bool] = True

    def __init__(self, cfg: RealBenchStageConfig) -> None:
        super().__init__(cfg)
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request
        self.recorder: Recorder | None = None
        self.base_url = self.knobs.base_url.rstrip("/")
        self.model_name: str | None = self.knobs.served_model_name
        self.server: ManagedServer | None = None
        self.log_path: Path | None = None
        self.served_model_id: str | None = None
        """What the server says it serves (``/v1/models``: ``root``, else ``id``)."""
        self._client: Any = None
        self._closed = False
        self._senders = SenderPool(lambda req: self._stream(req, self.recorder))
        self._loop: StreamLoop | None = None
        self._aclient: Any = None
        self.wall_minus_perf_s = -wall_offset_s()
        """``time.time() − time.perf_counter()`` here, for the server's wall-clock stamps;
        measured again after the warm-up, next to the measured requests (NTP steps the wall
        clock, as on a machine that has just booted)."""

    @property
    def knobs(self) -> HttpBackendConfig:
        """``cfg.backend``, an engine spoken to over HTTP."""
        return as_engine(self.cfg.backend, HttpBackendConfig)

    # ------------------------------------------------------------------ checks and start-up
    @property
    def starts_server(self) -> bool:
        return self.knobs.server.kind == "transformers_serve"

    @property
    def exact_length(self) -> str:
        mode = self.knobs.exact_length
        if mode == "auto":
            return "generation_config" if self.starts_server else "ignore_eos"
        return mode

    def check(self, requests: Sequence[BenchRequest]) -> None:
        if self.knobs.server.kind == "vllm" and self.name == "openai":
            raise ValueError("backend.server.kind=vllm starts a vLLM server: use backend=vllm")
        if self.starts_server:
            path = self.cfg.model.local_path
            if not path or not (Path(path) / "config.json").is_file():
                raise ValueError(
                    "backend.server.kind=transformers_serve needs model.local_path=<a saved "
                    f"model directory with config.json and a tokenizer>, got {path!r}"
                )
            if any(r.prompt_text is None for r in requests):
                raise ValueError(
                    "transformers serve takes text prompts only: build the workload with "
                    "workload.prompt_mode=text"
                )
            return
        import httpx

        try:
            httpx.get(f"{self.base_url}/v1/models", timeout=CONNECT_TIMEOUT_S).raise_for_status()
        except httpx.HTTPError as exc:
            raise ValueError(
                f"backend.base_url={self.base_url}: endpoint unreachable ({exc}); start the "
                "server or pass backend.base_url=..."
            ) from exc

    def _server_command(self, port: int) -> list[str]:
        exe = Path(sys.executable).with_name("transformers")
        b = as_engine(self.cfg.backend, OpenAIBackendConfig)
        cmd = [
            str(exe) if exe.exists() else (shutil.which("transformers") or "transformers"),
            "serve",
            str(self.cfg.model.local_path),
            "--continuous-batching",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            self.cfg.hardware.device,
            "--dtype",
            self.cfg.dtype,
            "--cb-block-size",
            str(b.block_size),
            "--cb-num-blocks",
            str(b.num_gpu_blocks_override),
            "--cb-max-batch-tokens",
            str(b.max_num_batched_tokens),
            "--attn-implementation",
            self.cfg.attn_implementation,
        ]
        return cmd + [str(a) for a in b.server.extra_args]

    def _start_server(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.launch_server(self._server_command, env)

    def launch_server(
        self,
        command: Callable[[int], list[str]],
        env: Mapping[str, str],
        hook: LineHook | None = None,
    ) -> float:
        """Start ``command(port)`` on a loopback port (``server.port`` or a free one), its log
        as ``server.log`` in :attr:`log_dir` (or a temporary folder), and wait for ``/health``;
        returns the seconds it took, or raises :class:`BackendError` with the log's root cause."""
        folder = self.log_dir or Path(tempfile.mkdtemp(prefix=f"{self.name}-server-"))
        self.log_path = folder / SERVER_LOG

        def started(server: ManagedServer, port: int) -> None:
            self.server = server
            self.base_url = f"http://127.0.0.1:{port}"

        try:
            return start_on_loopback(
                command,
                self.log_path,
                env,
                hook,
                self.knobs.server.startup_timeout_s,
                self.knobs.server.port,
                started,
            )
        except ServerError as exc:
            raise BackendError(str(exc)) from None

    def start(self, recorder: Recorder) -> None:
        import httpx

        self.recorder = recorder
        if self.knobs.client == "asyncio":
            self._loop = StreamLoop().start()
        else:
            self._senders.start()
        if self.starts_server:
            self._start_server()
        # an idle connection is dropped here before the server's keep-alive timeout (uvicorn's
        # 5 s, httpx's default too) can close it under a request being sent on it: that race
        # reset a calibration request on a loaded 2-core machine
        limits = httpx.Limits(
            max_connections=None,
            max_keepalive_connections=64,
            keepalive_expiry=KEEPALIVE_EXPIRY_S,
        )
        timeout = httpx.Timeout(self.knobs.request_timeout_s, connect=CONNECT_TIMEOUT_S)
        self._client = httpx.Client(timeout=timeout, limits=limits)
        if self._loop is not None:

            async def make_client() -> Any:  # made on the loop that will use it
                return httpx.AsyncClient(timeout=timeout, limits=limits)

            self._aclient = self._loop.call(make_client(), CONNECT_TIMEOUT_S)
        if self.knobs.server.kind == "transformers_serve":
            self.model_name = self.model_name or str(self.cfg.model.local_path)
            self.served_model_id = str(self.cfg.model.local_path)
            return
        models = self._client.get(f"{self.base_url}/v1/models").json().get("data") or []
        if self.model_name is None:
            fallback = self.cfg.model.local_path or self.cfg.model.hf_name
            self.model_name = str(models[0]["id"]) if models else str(fallback)
        served = next((m for m in models if m.get("id") == self.model_name), None)
        if served is not None:
            self.served_model_id = str(served.get("root") or served["id"])

    # ------------------------------------------------------------------ requests
    def body(self, req: BenchRequest) -> dict[str, Any]:
        """The JSON body of one request (exact length forced as the server understands it)."""
        body: dict[str, Any] = {
            "model": self.model_name,
            "prompt": req.prompt_text
            if req.prompt_text is not None
            else list(req.prompt_token_ids or ()),
            "max_tokens": req.num_decode_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.exact_length == "ignore_eos":
            body.update(ignore_eos=True, min_tokens=req.num_decode_tokens)
        elif self.exact_length == "generation_config":
            body["generation_config"] = json.dumps(
                {"max_new_tokens": req.num_decode_tokens, "eos_token_id": -1, "do_sample": False}
            )
        return body

    def _stream(self, req: BenchRequest, recorder: Recorder | None) -> None:
        """Send one request and record its events; closes it in the recorder (if given)."""
        import httpx

        reader = StreamReader(req.request_id, recorder)
        try:
            with self._client.stream(
                "POST", f"{self.base_url}/v1/completions", json=self.body(req)
            ) as response:
                if response.status_code != 200:
                    detail = response.read().decode(errors="replace")[:500]
                    raise BackendError(f"HTTP {response.status_code}: {detail}")
                for line in response.iter_lines():
                    reader.line(line, time.perf_counter())
        except (httpx.HTTPError, BackendError, ValueError) as exc:
            if recorder is None:
                raise BackendError(f"warm-up request failed: {exc}") from exc
            recorder.finish(req.request_id, STATUS_ERROR, f"{type(exc).__name__}: {exc}")
            return
        reader.finish_ok()

    async def _astream(self, req: BenchRequest, recorder: Recorder) -> None:
        """:meth:`_stream` on the event loop: the same request, events and closing."""
        import httpx

        reader = StreamReader(req.request_id, recorder)
        try:
            async with self._aclient.stream(
                "POST", f"{self.base_url}/v1/completions", json=self.body(req)
            ) as response:
                if response.status_code != 200:
                    detail = (await response.aread()).decode(errors="replace")[:500]
                    raise BackendError(f"HTTP {response.status_code}: {detail}")
                async for line in response.aiter_lines():
                    reader.line(line, time.perf_counter())
        except (httpx.HTTPError, BackendError, ValueError) as exc:
            recorder.finish(req.request_id, STATUS_ERROR, f"{type(exc).__name__}: {exc}")
            return
        reader.finish_ok()

    def warmup(self, requests: Sequence[BenchRequest]) -> None:
        for req in requests:
            self._stream(req, None)
        self.wall_minus_perf_s = -wall_offset_s()

    def submit(self, request: BenchRequest) -> None:
        """Stamp the arrival and hand the request to the event loop (``backend.client=asyncio``)
        or to a sender thread that is already running (starting a thread here would keep the
        replay from the next arrival)."""
        assert self.recorder is not None
        recorder = self.recorder
        recorder.arrived(request.request_id, time.perf_counter())
        if self._loop is not None:
            self._loop.submit(lambda: self._astream(request, recorder))
        else:
            self._senders.put(request)

    def failure(self) -> str | None:
        return self.server.failure() if self.server is not None else None

    def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        self._senders.stop()
        if self._loop is not None:
            if self._aclient is not None:
                with contextlib.suppress(TimeoutError, RuntimeError):  # a stopped loop: no sockets
                    self._loop.call(self._aclient.aclose(), CONNECT_TIMEOUT_S)
            self._loop.stop()
        if self._client is not None:
            self._client.close()
        if self.server is not None:
            self.server.stop()

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "name": self.name,
            "base_url": self.base_url,
            "served_model_name": self.model_name,
            "exact_length": self.exact_length,
            "client": self.knobs.client,
            "server": self.knobs.server.kind,
            "device": "remote" if not self.starts_server else self.cfg.hardware.device,
            "dtype": self.cfg.dtype,
            "attn_implementation": self.cfg.attn_implementation if self.starts_server else None,
        }
        if self.served_model_id is not None:
            info["model_id"] = self.served_model_id
        if self.server is not None and self.knobs.server.kind == "transformers_serve":
            info.update(
                server_pid=self.server.pid,
                server_command=self._server_command(int(self.base_url.rsplit(":", 1)[1])),
                server_log=str(self.log_path),
            )
        return info
