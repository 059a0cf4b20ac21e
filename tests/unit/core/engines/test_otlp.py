"""The engine's clock from a vLLM server's OpenTelemetry spans (core/engines/otlp.py), on real
exports the vLLM 0.32 CPU server sent (tests/data/vllm/otlp/)."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from gpu_simulate_test.core.engines import otlp

DATA = Path(__file__).resolve().parents[3] / "data" / "vllm" / "otlp"


def test_a_real_export_gives_each_requests_engine_durations() -> None:
    spans = otlp.parse_export((DATA / "llm_request_spans.pb").read_bytes())
    assert [s.request_id for s in spans] == ["cmpl-gst026524e4-1-0", "cmpl-gst026524e4-3-0"]
    first = spans[0]
    assert first.completion_tokens == 46
    assert first.queue_s == pytest.approx(2.2974e-05, rel=1e-4)
    assert first.prefill_s == pytest.approx(0.01814284, rel=1e-6)
    assert first.decode_s == pytest.approx(0.20917426, rel=1e-6)
    # the front end's TTFT holds the engine's plus the hops around it
    assert first.front_ttft_s > first.engine_ttft_s
    assert first.front_e2e_s > first.engine_e2e_s
    assert first.front_arrival_wall_s == pytest.approx(1795596119.5886626)
    # spans that are not a request's (the server loading) are left out
    assert otlp.parse_export((DATA / "loading_spans.pb").read_bytes()) == []


def test_spans_are_matched_to_this_runs_requests_only() -> None:
    spans = {
        s.request_id: s for s in otlp.parse_export((DATA / "llm_request_spans.pb").read_bytes())
    }
    assert sorted(otlp.matching(spans, "026524e4")) == [1, 3]
    assert otlp.matching(spans, "0265") == {}  # another run's token
    assert otlp.request_tag("026524e4", 1) == "gst026524e4-1"


def test_engine_stamps_keep_the_engines_durations_on_the_run_clock() -> None:
    span = otlp.parse_export((DATA / "llm_request_spans.pb").read_bytes())[0]
    wall_minus_perf = span.front_arrival_wall_s - 100.0  # the front end got it at perf 100 s
    stamps = otlp.engine_stamps(span, wall_minus_perf)
    assert stamps["last_token"] == pytest.approx(100.0 + span.front_e2e_s)
    assert stamps["last_token"] - stamps["first_token"] == pytest.approx(span.decode_s)
    assert stamps["first_token"] - stamps["arrival"] == pytest.approx(span.engine_ttft_s)
    assert stamps["scheduled"] - stamps["arrival"] == pytest.approx(span.queue_s)
    # the engine queued it after the front end received it
    assert stamps["arrival"] >= 100.0


def test_the_receiver_keeps_what_the_server_posts(tmp_path: Path) -> None:
    path = tmp_path / "spans.jsonl"
    receiver = otlp.SpanReceiver(path).start()
    try:
        for name in ("loading_spans.pb", "llm_request_spans.pb"):
            request = urllib.request.Request(
                receiver.endpoint,
                data=(DATA / name).read_bytes(),
                headers={"Content-Type": "application/x-protobuf"},
            )
            assert urllib.request.urlopen(request, timeout=5).status == 200
        bad = urllib.request.Request(receiver.endpoint, data=b"\xff\xff not protobuf")
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(bad, timeout=5)
    finally:
        receiver.stop()
    assert receiver.errors == 1 and receiver.last_error
    lines = path.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[0])["completion_tokens"] == 46
    got = otlp.wait_for(path, "026524e4", {1, 3, 5}, timeout_s=0.2)  # 5 never comes
    assert sorted(got) == [1, 3]
