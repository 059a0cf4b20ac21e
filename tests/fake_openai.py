"""A small OpenAI-compatible streaming server for tests: ``/v1/completions`` as vLLM streams it
(``return_token_ids``: each chunk's ``token_ids``, the prompt's in the first; a final usage chunk
with ``prompt_tokens_details.cached_tokens``; ``data: [DONE]``), plus ``/v1/models``,
``/version``, ``/metrics`` and ``/health``. Run as its own process so the client under test keeps
its GIL::

    python -m tests.fake_openai --port 8123 --log requests.jsonl [--itl-s 0.002]
        [--short-ids-for 7]

Each output is ``max_tokens`` ids (as ``ignore_eos`` makes vLLM's), one per chunk every
``--itl-s``; the ids are a function of the prompt, so a test can rebuild them. A prompt's
``cached_tokens`` are the full 32-token blocks it shares with an earlier prompt (never its last
token), as vLLM's prefix cache would report. ``--short-ids-for K``: a request with
``max_tokens=K`` streams K chunks and a usage of K tokens, but its last chunk carries no
``token_ids`` (a server that lost one: the client must not build on it). Every request is logged
as one JSON line (its prompt, ``max_tokens`` and the ids returned) once its stream ended.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

BLOCK = 32
MODEL = "qwen3_tiny"


def output_ids(prompt: list[int], count: int) -> list[int]:
    """The ids the server returns for ``prompt``: ``count`` of them, a function of the prompt."""
    seed = (len(prompt) * 31 + sum(prompt[-4:])) % 5000
    return [1000 + (seed + 7 * i) % 5000 for i in range(count)]


def cached_tokens(prompt: list[int], seen: list[list[int]]) -> int:
    """Full blocks ``prompt`` shares with any earlier prompt (its last token always computed)."""
    best = 0
    for earlier in seen:
        same = 0
        for a, b in zip(prompt, earlier, strict=False):
            if a != b:
                break
            same += 1
        best = max(best, same)
    return min(best, len(prompt) - 1) // BLOCK * BLOCK


class _State:
    def __init__(self, log: Path, itl_s: float, short_ids_for: int | None) -> None:
        self.log = log
        self.itl_s = itl_s
        self.short_ids_for = short_ids_for
        self.lock = threading.Lock()
        self.seen: list[list[int]] = []


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # each response ends with its connection: no framing

        def log_message(self, *args: Any) -> None:
            pass

        def _json(self, payload: Any) -> None:
            body = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                self._json({"data": [{"id": MODEL, "root": MODEL, "max_model_len": 4096}]})
            elif self.path == "/version":
                self._json({"version": "fake"})
            elif self.path in ("/metrics", "/health"):
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()
            else:
                self.send_error(404)

        def _chunk(self, payload: dict[str, Any]) -> None:
            self.wfile.write(f"data: {json.dumps(payload)}\n\n".encode())
            self.wfile.flush()

        def do_POST(self) -> None:
            if self.path != "/v1/completions":
                self.send_error(404)
                return
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompt = [int(t) for t in body["prompt"]]
            count = int(body["max_tokens"])
            with state.lock:
                cached = cached_tokens(prompt, state.seen)
                state.seen.append(prompt)
            ids = output_ids(prompt, count)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            returned: list[int] = []
            for i, token in enumerate(ids):
                time.sleep(state.itl_s)
                choice: dict[str, Any] = {
                    "index": 0,
                    "text": " x",
                    "finish_reason": "length" if i == count - 1 else None,
                    "prompt_token_ids": prompt if i == 0 else None,
                    "token_ids": [token],
                }
                if count == state.short_ids_for and i == count - 1:
                    del choice["token_ids"]  # a lost id: the text still counts one token
                else:
                    returned.append(token)
                self._chunk({"id": "cmpl-fake", "choices": [choice], "model": MODEL})
            usage = {
                "prompt_tokens": len(prompt),
                "completion_tokens": count,
                "total_tokens": len(prompt) + count,
                "prompt_tokens_details": {"cached_tokens": cached},
            }
            self._chunk({"id": "cmpl-fake", "choices": [], "usage": usage})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            line = {"prompt": prompt, "max_tokens": count, "output_ids": returned}
            with state.lock, state.log.open("a") as handle:
                handle.write(json.dumps(line) + "\n")

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--itl-s", type=float, default=0.002)
    parser.add_argument("--short-ids-for", type=int, default=None)
    args = parser.parse_args()
    state = _State(args.log, args.itl_s, args.short_ids_for)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(state))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
