"""The engine's own clock of a vLLM server, per request, from its OpenTelemetry spans.

A vLLM server started with ``--otlp-traces-endpoint`` exports one ``llm_request`` span per
finished request (``vllm/v1/engine/output_processor.py`` ``do_tracing``). Its attributes carry
the engine core's own stamps as differences (``time.monotonic()`` in the engine-core process):

- ``gen_ai.latency.time_in_queue`` = first scheduled − queued (``scheduled_ts − queued_ts``);
- ``gen_ai.latency.time_in_model_prefill`` = first token − first scheduled;
- ``gen_ai.latency.time_in_model_decode`` = last token − first token;

and the front end's (the API server's wall clock): the span starts when the front end received
the request, ``gen_ai.latency.e2e`` is when it processed the last output.

:class:`SpanReceiver` is a minimal OTLP/HTTP (protobuf) trace receiver on 127.0.0.1 that keeps
those figures, one JSON line per span, in a file beside the server's log, so every stage pointed
at the server reads them (``backend.server.spans_file``). :func:`engine_stamps` turns one span
into the engine's stamps on the run's clock: the engine's durations (TTFT = queue + prefill, E2E
= queue + prefill + decode, TPOT = decode / (tokens − 1)) are the engine core's own, exact; they
are anchored on the moment the front end processed the last output (a span gives no absolute
engine stamp), so the absolute stamps sit later than the engine's by the hop from engine core to
front end, which a starved API server lengthens.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import MappingProxyType
from typing import Any

SPAN_NAME = "llm_request"
"""The span vLLM 0.32 exports per finished request."""
ATTRIBUTES: Mapping[str, str] = MappingProxyType(
    {
        "request_id": "gen_ai.request.id",
        "queue_s": "gen_ai.latency.time_in_queue",
        "prefill_s": "gen_ai.latency.time_in_model_prefill",
        "decode_s": "gen_ai.latency.time_in_model_decode",
        "front_ttft_s": "gen_ai.latency.time_to_first_token",
        "front_e2e_s": "gen_ai.latency.e2e",
        "completion_tokens": "gen_ai.usage.completion_tokens",
    }
)
"""Our field → the span attribute it is read from."""
SERVER_ENV: Mapping[str, str] = MappingProxyType(
    {
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_BSP_SCHEDULE_DELAY": "200",
        "OTEL_SERVICE_NAME": "vllm",
    }
)
"""What the server's exporter needs: our receiver speaks OTLP over HTTP (protobuf), and spans
are sent every 200 ms rather than every 5 s."""


@dataclass(frozen=True)
class RequestSpan:
    """One request's span, in seconds: the front end's arrival (wall clock) and the engine's
    durations."""

    request_id: str
    front_arrival_wall_s: float
    queue_s: float
    prefill_s: float
    decode_s: float
    front_ttft_s: float
    front_e2e_s: float
    completion_tokens: int

    @property
    def engine_ttft_s(self) -> float:
        return self.queue_s + self.prefill_s

    @property
    def engine_e2e_s(self) -> float:
        return self.queue_s + self.prefill_s + self.decode_s


def _value(attribute: Any) -> Any:
    kind = attribute.value.WhichOneof("value")
    return getattr(attribute.value, kind) if kind else None


def parse_export(body: bytes) -> list[RequestSpan]:
    """The ``llm_request`` spans of one OTLP ``ExportTraceServiceRequest`` (protobuf); spans
    without every field are left out (another instrumentation, or an aborted request)."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    message = ExportTraceServiceRequest()
    message.ParseFromString(body)
    spans = []
    for resource in message.resource_spans:
        for scope in resource.scope_spans:
            for span in scope.spans:
                if span.name != SPAN_NAME:
                    continue
                attrs = {a.key: _value(a) for a in span.attributes}
                fields: dict[str, Any] = {name: attrs.get(key) for name, key in ATTRIBUTES.items()}
                if any(v is None for v in fields.values()):
                    continue
                spans.append(
                    RequestSpan(
                        request_id=str(fields["request_id"]),
                        front_arrival_wall_s=span.start_time_unix_nano / 1e9,
                        queue_s=float(fields["queue_s"]),
                        prefill_s=float(fields["prefill_s"]),
                        decode_s=float(fields["decode_s"]),
                        front_ttft_s=float(fields["front_ttft_s"]),
                        front_e2e_s=float(fields["front_e2e_s"]),
                        completion_tokens=int(fields["completion_tokens"]),
                    )
                )
    return spans


class SpanReceiver:
    """An OTLP/HTTP trace receiver on 127.0.0.1 (a free port) that appends each request's span
    as one JSON line to ``path`` (flushed per export). :attr:`endpoint` is what the server's
    ``--otlp-traces-endpoint`` takes; :attr:`errors` counts exports it could not read."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.errors = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    receiver.keep(parse_export(body))
                    status = 200
                except Exception as exc:  # a bad export is counted and said, never fatal
                    receiver.errors += 1
                    receiver.last_error = f"{type(exc).__name__}: {exc}"
                    status = 400
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:  # quiet
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="otlp-receiver", daemon=True
        )

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1/traces"

    def start(self) -> SpanReceiver:
        self._thread.start()
        return self

    def keep(self, spans: list[RequestSpan]) -> None:
        if not spans:
            return
        lines = "".join(json.dumps(asdict(s)) + "\n" for s in spans)
        with self._lock, open(self.path, "a", encoding="utf-8") as handle:
            handle.write(lines)
            handle.flush()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def read_spans(path: Path) -> dict[str, RequestSpan]:
    """Every span kept in ``path`` by request id (a line cut short by a concurrent write is
    skipped: it is written whole a moment later)."""
    spans: dict[str, RequestSpan] = {}
    if not Path(path).is_file():
        return spans
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            span = RequestSpan(**json.loads(line))
        except (ValueError, TypeError):
            continue
        spans[span.request_id] = span
    return spans


def request_tag(run_token: str, request_id: int) -> str:
    """The id our client gives request ``request_id`` of one run (vLLM's ``request_id`` field;
    its span carries it as ``cmpl-<tag>-0``)."""
    return f"gst{run_token}-{request_id}"


def matching(spans: Mapping[str, RequestSpan], run_token: str) -> dict[int, RequestSpan]:
    """The spans of one run's requests, by our request id."""
    pattern = re.compile(rf"(?:^|-)gst{re.escape(run_token)}-(\d+)(?:-\d+)?$")
    out: dict[int, RequestSpan] = {}
    for span_id, span in spans.items():
        found = pattern.search(span_id)
        if found:
            out[int(found.group(1))] = span
    return out


def wait_for(
    path: Path, run_token: str, request_ids: set[int], timeout_s: float = 3.0
) -> dict[int, RequestSpan]:
    """The run's spans once every one of ``request_ids`` has one, or what came within
    ``timeout_s`` (the server exports every 200 ms)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = matching(read_spans(path), run_token)
        if request_ids <= found.keys() or time.monotonic() >= deadline:
            return {k: v for k, v in found.items() if k in request_ids}
        time.sleep(0.05)


def engine_stamps(span: RequestSpan, wall_minus_perf_s: float) -> dict[str, float]:
    """The engine's stamps of one request as ``perf_counter()`` readings (``wall_minus_perf_s``:
    ``time.time() − time.perf_counter()`` in this process): anchored on the front end's
    processing of the last output, the engine core's durations before it."""
    last = span.front_arrival_wall_s + span.front_e2e_s - wall_minus_perf_s
    first = last - span.decode_s
    scheduled = first - span.prefill_s
    return {
        "arrival": scheduled - span.queue_s,
        "scheduled": scheduled,
        "first_token": first,
        "last_token": last,
    }
