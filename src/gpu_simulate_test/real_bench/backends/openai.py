"""``openai``: an OpenAI-compatible streaming client (``/v1/completions``, SSE).

For a server the user runs (vLLM, SGLang, ``transformers serve``: ``server.kind=external``) or
one this backend starts on 127.0.0.1 and stops by pid (``server.kind=transformers_serve``).
Every SSE event is stamped when it arrives; output tokens are counted from ``usage`` (asked for
with ``stream_options.include_usage``), and a mismatch between events and the count is flagged
in ``request_metrics.csv`` (``token_count_mismatch``): a chunk may carry several tokens, or none.

Exact output lengths: ``ignore_eos`` for vLLM/SGLang; ``transformers serve`` rejects it but
honours ``generation_config='{"max_new_tokens": N, "eos_token_id": -1}'``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.real_bench.backends.base import Backend, BackendError
from gpu_simulate_test.real_bench.records import (
    STATUS_ERROR,
    STATUS_OK,
    BenchRequest,
    Recorder,
)

CONNECT_TIMEOUT_S = 5.0


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def parse_sse_line(line: str) -> dict[str, Any] | None:
    """The JSON payload of one ``data:`` line; None for blank lines, comments and ``[DONE]``."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if not data or data == "[DONE]":
        return None
    payload = json.loads(data)
    return payload if isinstance(payload, dict) else None


class OpenAIBackend(Backend):
    """Streaming ``/v1/completions`` requests, one thread each, against a local or remote server."""

    name: ClassVar[str] = "openai"
    in_process: ClassVar[bool] = False

    def __init__(self, cfg: RealBenchStageConfig) -> None:
        super().__init__(cfg)
        self.recorder: Recorder | None = None
        self.base_url = cfg.backend.base_url.rstrip("/")
        self.model_name: str | None = cfg.backend.served_model_name
        self.process: subprocess.Popen[bytes] | None = None
        self.log_path: Path | None = None
        self._client: Any = None
        self._closed = False
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ checks and start-up
    @property
    def starts_server(self) -> bool:
        return self.cfg.backend.server.kind == "transformers_serve"

    @property
    def exact_length(self) -> str:
        mode = self.cfg.backend.exact_length
        if mode == "auto":
            return "generation_config" if self.starts_server else "ignore_eos"
        return mode

    def check(self, requests: Sequence[BenchRequest]) -> None:
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
        b = self.cfg.backend
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
            str(b.num_blocks),
            "--cb-max-batch-tokens",
            str(b.max_batch_tokens),
            "--attn-implementation",
            self.cfg.attn_implementation,
        ]
        return cmd + [str(a) for a in b.server.extra_args]

    def _start_server(self) -> None:
        port = self.cfg.backend.server.port or free_loopback_port()
        self.base_url = f"http://127.0.0.1:{port}"
        log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - kept open for the server's lifetime
            prefix="transformers-serve-", suffix=".log", delete=False
        )
        self.log_path = Path(log.name)
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.process = subprocess.Popen(
            self._server_command(port), stdout=log, stderr=subprocess.STDOUT, env=env
        )
        log.close()
        self._wait_for_server(self.cfg.backend.server.startup_timeout_s)

    def _wait_for_server(self, timeout_s: float) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if (why := self.failure()) is not None:
                raise BackendError(f"server did not start: {why}\n{self._log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            time.sleep(0.5)
        raise BackendError(f"server not up after {timeout_s:g} s\n{self._log_tail()}")

    def _log_tail(self, chars: int = 2000) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        return self.log_path.read_text(errors="replace")[-chars:]

    def start(self, recorder: Recorder) -> None:
        import httpx

        self.recorder = recorder
        logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request
        if self.starts_server:
            self._start_server()
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._client = httpx.Client(
            timeout=httpx.Timeout(self.cfg.backend.request_timeout_s, connect=CONNECT_TIMEOUT_S),
            limits=limits,
        )
        if self.model_name is None and self.starts_server:
            self.model_name = str(self.cfg.model.local_path)
        elif self.model_name is None:
            models = self._client.get(f"{self.base_url}/v1/models").json().get("data", [])
            fallback = self.cfg.model.local_path or self.cfg.model.hf_name
            self.model_name = str(models[0]["id"]) if models else str(fallback)

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

        rid = req.request_id
        usage: int | None = None
        try:
            with self._client.stream(
                "POST", f"{self.base_url}/v1/completions", json=self.body(req)
            ) as response:
                if response.status_code != 200:
                    detail = response.read().decode(errors="replace")[:500]
                    raise BackendError(f"HTTP {response.status_code}: {detail}")
                for line in response.iter_lines():
                    now = time.perf_counter()
                    payload = parse_sse_line(line)
                    if payload is None:
                        continue
                    if "error" in payload:
                        raise BackendError(f"server error: {payload['error']}")
                    if payload.get("usage"):
                        usage = int(payload["usage"].get("completion_tokens", 0))
                    choices = payload.get("choices") or []
                    if choices and choices[0].get("text") and recorder is not None:
                        recorder.tokens(rid, now, 1)
        except (httpx.HTTPError, BackendError, ValueError) as exc:
            if recorder is None:
                raise BackendError(f"warm-up request failed: {exc}") from exc
            recorder.finish(rid, STATUS_ERROR, f"{type(exc).__name__}: {exc}")
            return
        if recorder is not None:
            recorder.finish(rid, STATUS_OK, reported_decode_tokens=usage)

    def warmup(self, requests: Sequence[BenchRequest]) -> None:
        for req in requests:
            self._stream(req, None)

    def submit(self, request: BenchRequest) -> None:
        assert self.recorder is not None
        self.recorder.arrived(request.request_id, time.perf_counter())
        thread = threading.Thread(
            target=self._stream, args=(request, self.recorder), name=f"req-{request.request_id}"
        )
        thread.daemon = True
        thread.start()
        self._threads.append(thread)

    def failure(self) -> str | None:
        if self.process is not None and (code := self.process.poll()) is not None:
            return f"server process {self.process.pid} exited with code {code}"
        return None

    def close(self, abort: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        if self._client is not None:
            self._client.close()
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=15)

    def describe(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "name": self.name,
            "base_url": self.base_url,
            "served_model_name": self.model_name,
            "exact_length": self.exact_length,
            "server": self.cfg.backend.server.kind,
            "device": "remote" if not self.starts_server else self.cfg.hardware.device,
            "dtype": self.cfg.dtype,
            "attn_implementation": self.cfg.attn_implementation if self.starts_server else None,
        }
        if self.process is not None:
            info.update(
                server_pid=self.process.pid,
                server_command=self._server_command(int(self.base_url.rsplit(":", 1)[1])),
                server_log=str(self.log_path),
            )
        return info
