"""Each server's load as the client's router scrapes it: the two gauges and the cache size read
off a real vLLM server's ``/metrics`` text (``tests/data/vllm/metrics_tiny.prom``), and the
poller against a live HTTP server, its latest reading replacing the last."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from gpu_simulate_test.core.engines.server_load import (
    ServerLoads,
    read_cache_info,
    read_load,
)

PROM = Path(__file__).parents[3] / "data" / "vllm" / "metrics_tiny.prom"


def _loaded(waiting: float, usage: float) -> str:
    text = PROM.read_text()
    text = text.replace(
        'vllm:num_requests_waiting{engine="0",model_name="<scratch>/models/tiny"} 0.0',
        f'vllm:num_requests_waiting{{engine="0",model_name="<scratch>/models/tiny"}} {waiting}',
    )
    return text.replace(
        'vllm:kv_cache_usage_perc{engine="0",model_name="<scratch>/models/tiny"} 0.0',
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="<scratch>/models/tiny"}} {usage}',
    )


def test_the_gauges_and_the_cache_size_of_a_real_server_s_metrics() -> None:
    assert read_load(PROM.read_text()) == (0, 0.0)
    assert read_load(_loaded(3.0, 0.25)) == (3, 0.25)  # not the waiting_by_reason lines
    info = read_cache_info(PROM.read_text())
    assert info["num_gpu_blocks"] == "16384" and info["block_size"] == "128"
    assert read_load("# nothing\n") is None and read_cache_info("") == {}


def test_the_poller_keeps_each_server_s_latest_scrape() -> None:
    state = {"text": _loaded(0.0, 0.0)}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = state["text"].encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    loads = ServerLoads([url, url], poll_s=0.01, fallback_blocks=7)
    try:
        loads.start()
        assert loads.num_gpu_blocks == [16384, 16384] and loads.block_size == 128
        state["text"] = _loaded(2.0, 0.5)
        deadline = time.perf_counter() + 10
        while loads.loads != [(2, 0.5), (2, 0.5)] and time.perf_counter() < deadline:
            time.sleep(0.01)
        assert loads.loads == [(2, 0.5), (2, 0.5)]
        assert loads.scrapes >= 2 and loads.failures == 0
    finally:
        loads.stop()
        server.shutdown()
    assert loads._thread is not None and not loads._thread.is_alive()
    assert loads.describe()["poll_s"] == 0.01
