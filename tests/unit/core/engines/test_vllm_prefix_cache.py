"""Prefix caching in the real bench's truth (``backend.enable_prefix_caching``), on real vLLM 0.32
output (``tests/data/vllm/prefix_cache``): the usage chunk's ``cached_tokens`` read by the
streaming client, the scheduler's admission hits read from its record, the two checked against
each other, the hit rate, the server's flags and the cache's reset before the measured run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest

from gpu_simulate_test.core.engines import prefix_cache
from gpu_simulate_test.core.engines.base import BackendError
from gpu_simulate_test.core.engines.openai import parse_sse_line, read_usage
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder, RequestRecord
from gpu_simulate_test.core.engines.step_record import read_record
from gpu_simulate_test.core.engines.vllm import VllmBackend
from gpu_simulate_test.io.artifacts import read_csv, write_csv
from gpu_simulate_test.io.schemas import REQUEST_METRICS
from gpu_simulate_test.real_bench.engine_record import check_cached_tokens
from gpu_simulate_test.real_bench.metrics import request_frame
from tests.conftest import vllm_stage_config

DATA = Path(__file__).resolve().parents[3] / "data" / "vllm"
CACHE = DATA / "prefix_cache"
TOKEN = "63847f12"
"""The run token of the recorded run's requests (``cmpl-gst<token>-<id>-...``)."""
BLOCK = 32


def _payloads(name: str) -> list[dict[str, Any]]:
    lines = (CACHE / name).read_text().splitlines()
    return [p for p in (parse_sse_line(line) for line in lines) if p is not None]


def _usage(name: str) -> dict[str, Any]:
    (usage,) = [p["usage"] for p in _payloads(name) if p.get("usage")]
    return usage


# ---------------------------------------------------------------------------- the usage chunk
def test_the_final_usage_chunk_of_a_real_server_gives_cached_tokens() -> None:
    assert read_usage(_usage("stream_miss.sse")) == (3, 0)
    assert read_usage(_usage("stream_hit.sse")) == (3, 32)  # one full block of the 40 tokens
    assert read_usage(_usage("stream_after_reset.sse")) == (3, 0)
    # caching off (no --enable-prompt-tokens-details): the same usage without its details
    bare = {k: v for k, v in _usage("stream_hit.sse").items() if k != "prompt_tokens_details"}
    assert read_usage(bare) == (3, None)
    assert read_usage({**bare, "prompt_tokens_details": None}) == (3, None)


def _serve(name: str) -> httpx.MockTransport:
    body = (CACHE / name).read_bytes()
    return httpx.MockTransport(
        lambda request: httpx.Response(200, content=body, headers={"content-type": "text/plain"})
    )


@pytest.mark.parametrize(("stream", "expected"), [("stream_hit.sse", 32), ("stream_miss.sse", 0)])
def test_the_client_records_each_request_s_cached_tokens(
    compose_stage: Any, stream: str, expected: int
) -> None:
    backend = VllmBackend(vllm_stage_config(compose_stage))
    backend.model_name = "qwen3_tiny"
    backend._client = httpx.Client(transport=_serve(stream))
    req = BenchRequest(0, 40, 3, 0.0, prompt_token_ids=tuple(range(1000, 1040)))
    recorder = Recorder([req])
    recorder.arrived(0, 0.0)
    backend._stream(req, recorder)
    (rec,) = recorder.snapshot()
    assert rec.status == "ok" and rec.num_decode_tokens == 3
    assert rec.cached_tokens == expected and rec.engine_cached_tokens is None


# ---------------------------------------------------------------------------- request_metrics
def _record(rid: int, cached: int | None, engine: int | None) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        num_prefill_tokens=80,
        expected_decode_tokens=2,
        scheduled_arrival_s=0.1 * rid,
        arrival_s=0.1 * rid,
        event_times_s=[0.1 * rid + 0.05, 0.1 * rid + 0.07],
        event_num_tokens=[1, 1],
        cached_tokens=cached,
        engine_cached_tokens=engine,
        status="ok",
    )


def test_request_metrics_carry_cached_tokens_and_empty_where_unreported(tmp_path: Path) -> None:
    records = [_record(0, 0, 0), _record(1, 64, 64), _record(2, None, None)]
    path = write_csv(tmp_path / "request_metrics.csv", request_frame(records), REQUEST_METRICS)
    table = read_csv(path, REQUEST_METRICS)
    assert table["cached_tokens"].tolist()[:2] == [0, 64]
    assert pd.isna(table["cached_tokens"].iloc[2])
    assert table["engine_cached_tokens"].tolist()[:2] == [0, 64]
    assert REQUEST_METRICS.version >= "1.2"  # the prefix-cache columns came with 1.2
    lines = path.read_text().splitlines()  # integers, not floats; empty where unknown
    assert ",cached_tokens,engine_cached_tokens," in lines[0]
    assert ",64,64," in lines[2] and ",64.0" not in lines[2]


def test_a_run_written_before_the_columns_existed_still_reads() -> None:
    old = read_csv(DATA / "step_record" / "request_metrics.csv", REQUEST_METRICS)
    assert len(old) == 40 and "cached_tokens" not in old.columns


def test_a_negative_cached_count_is_refused_naming_the_column(tmp_path: Path) -> None:
    frame = request_frame([_record(0, 0, 0)])
    frame.loc[0, "cached_tokens"] = -32
    with pytest.raises(ValueError, match="cached_tokens"):
        write_csv(tmp_path / "bad.csv", frame, REQUEST_METRICS)


# ---------------------------------------------------------------------------- the scheduler's hits
def test_the_scheduler_s_admission_hits_are_the_usage_s_cached_tokens() -> None:
    record = read_record(CACHE / "engine_steps.jsonl", TOKEN)
    usage = pd.read_csv(CACHE / "request_metrics.csv").set_index("request_id")
    lengths = pd.read_csv(CACHE / "trace_lengths.csv").set_index("request_id")
    assert sorted(record.requests) == list(range(12))
    hits = {rid: st.cached_tokens for rid, st in record.requests.items()}
    assert hits == usage["cached_tokens"].to_dict()
    # the first request of each prefix misses, every later one hits the prefix's full blocks
    for _, group in lengths.groupby("prefix_id"):
        first, *later = sorted(group.index)
        assert hits[first] == 0
        assert all(hits[rid] == group.loc[rid, "prefix_len"] // BLOCK * BLOCK for rid in later)
    assert sum(v for v in hits.values() if v is not None) == 512  # the counters' delta


def test_a_record_without_hits_leaves_them_unknown() -> None:
    record = read_record(DATA / "step_record" / "engine_steps.jsonl", "d4935f80")
    assert all(st.cached_tokens is None for st in record.requests.values())


def test_a_preempted_request_keeps_its_first_admission_s_hit(tmp_path: Path) -> None:
    # the recording scheduler writes no hit for a re-admission; a hit of 0 then is not read as one
    lines = [
        {"q": "cmpl-gstabcdef01-0-0-aa", "t": 1.0},
        {"s": 1.0, "e": 1.1, "r": [["cmpl-gstabcdef01-0-0-aa", 64, 1, 0, 0]], "p": [],
         "w": 0, "n": 1, "h": {"cmpl-gstabcdef01-0-0-aa": 32}},
        {"s": 1.2, "e": 1.3, "r": [], "p": ["cmpl-gstabcdef01-0-0-aa"], "w": 1, "n": 0},
        {"s": 1.4, "e": 1.5, "r": [["cmpl-gstabcdef01-0-0-aa", 65, 1, 1, 1]], "p": [],
         "w": 0, "n": 1},
    ]  # fmt: skip
    path = tmp_path / "steps.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    stamps = read_record(path, "abcdef01").requests[0]
    assert stamps.cached_tokens == 32 and stamps.preemptions == 1


# ---------------------------------------------------------------------------- agreement, hit rate
def test_disagreements_are_counted_and_listed_by_request() -> None:
    records = [_record(0, 0, 0), _record(1, 64, 32), _record(2, 64, None), _record(3, None, 0)]
    check = prefix_cache.agreement(records)
    assert check["requests_compared"] == 2 and check["disagreements"] == 1
    assert check["disagreeing"] == [{"request_id": 1, "usage": 64, "scheduler": 32}]
    assert check["usage_reported"] == 3 and check["scheduler_recorded"] == 3
    assert prefix_cache.agreement(records[:1])["disagreements"] == 0


def test_a_disagreement_is_said_not_failed(capsys: pytest.CaptureFixture[str]) -> None:
    check = prefix_cache.agreement([_record(0, 0, 0), _record(7, 64, 32)])
    check_cached_tokens({"cached_tokens_check": check}, served_ok=2)
    out = capsys.readouterr().out
    assert "1 of 2 request(s)" in out and "7 (64 vs 32)" in out
    check_cached_tokens({"cached_tokens_check": prefix_cache.agreement([_record(0, 0, 0)])}, 1)
    assert capsys.readouterr().out == ""
    unreported = prefix_cache.agreement([_record(0, None, 0)])
    check_cached_tokens({"cached_tokens_check": unreported}, served_ok=1)
    assert "--enable-prompt-tokens-details" in capsys.readouterr().out


def test_the_hit_rate_is_hit_tokens_over_queried_tokens() -> None:
    delta = {prefix_cache.HITS: 512.0, prefix_cache.QUERIES: 1025.0}
    assert prefix_cache.hit_rate(delta) == pytest.approx(512 / 1025)
    assert prefix_cache.hit_rate({prefix_cache.HITS: 0.0, prefix_cache.QUERIES: 0.0}) is None
    assert prefix_cache.hit_rate({}) is None


# ---------------------------------------------------------------------------- server and reset
def test_with_caching_the_server_reports_cached_tokens_and_serves_the_reset(
    compose_stage: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    on = VllmBackend(vllm_stage_config(compose_stage, "backend.enable_prefix_caching=true"))
    cmd = on.server_command(8000, tmp_path)
    assert "--enable-prefix-caching" in cmd and "--enable-prompt-tokens-details" in cmd
    assert on.server_env()["VLLM_SERVER_DEV_MODE"] == "1"
    off = VllmBackend(vllm_stage_config(compose_stage))
    cmd = off.server_command(8000, tmp_path)
    assert "--no-enable-prefix-caching" in cmd and "--enable-prompt-tokens-details" not in cmd
    assert "VLLM_SERVER_DEV_MODE" not in off.server_env()


def _server(answers: list[httpx.Response], posts: list[str]) -> httpx.Client:
    def handle(request: httpx.Request) -> httpx.Response:
        posts.append(f"{request.method} {request.url.path}")
        return answers.pop(0) if len(answers) > 1 else answers[0]

    return httpx.Client(transport=httpx.MockTransport(handle))


def test_the_reset_retries_while_blocks_are_held_then_passes() -> None:
    posts: list[str] = []
    busy, done = (
        httpx.Response(200, json={"success": False}),
        httpx.Response(200, json={"success": True}),
    )
    prefix_cache.reset(_server([busy, done], posts), "http://s", retry_s=5)
    assert posts == ["POST /reset_prefix_cache"] * 2


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (httpx.Response(200, json={"success": False}), "answered {'success': False}"),
        (httpx.Response(404, json={"detail": "Not Found"}), "VLLM_SERVER_DEV_MODE=1"),
        (httpx.Response(500, text="boom"), "HTTP 500: boom"),
        (httpx.Response(200, text="<html>"), "not JSON"),
    ],
)
def test_a_refused_reset_fails_clearly(answer: httpx.Response, message: str) -> None:
    with pytest.raises(BackendError, match="POST http://s/reset_prefix_cache") as err:
        prefix_cache.reset(_server([answer], []), "http://s", retry_s=0)
    assert message in str(err.value)


def test_the_run_records_how_its_cache_was_emptied(compose_stage: Any) -> None:
    posts: list[str] = []
    off = VllmBackend(vllm_stage_config(compose_stage))
    off._client = _server([httpx.Response(200, json={"success": True})], posts)
    assert off.reset_prefix_cache(sent=True) == "off" and not posts
    on = VllmBackend(vllm_stage_config(compose_stage, "backend.enable_prefix_caching=true"))
    on._client = _server([httpx.Response(200, json={"success": True})], posts)
    assert on.reset_prefix_cache(sent=False) == "endpoint"  # another's server: always reset
    assert posts == ["POST /reset_prefix_cache"]
    on.server = object()  # type: ignore[assignment]  # a server this run started
    assert on.reset_prefix_cache(sent=False) == "fresh_server" and len(posts) == 1
    assert on.reset_prefix_cache(sent=True) == "endpoint" and len(posts) == 2
    with pytest.raises(BackendError):
        on._client = _server([httpx.Response(404)], posts)
        on.reset_prefix_cache(sent=True)
