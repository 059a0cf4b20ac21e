"""The ``vllm_engine`` backend without starting vLLM: its knobs against the server's, its
up-front checks, and its event loop, recorder and shut-down over a stand-in ``AsyncLLM``."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gpu_simulate_test.config.backends import ServerConfig, VllmEngineBackendConfig
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.core.engines.harness import replay
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder
from gpu_simulate_test.core.engines.vllm import VllmBackend
from gpu_simulate_test.core.engines.vllm_engine import STEP_LOGGER, VllmEngineBackend
from gpu_simulate_test.real_bench.metrics import request_frame

KNOBS = ("backend.max_num_batched_tokens=512", "backend.enable_chunked_prefill=false")


def _cfg(compose_stage, backend: str, *overrides: str) -> RealBenchStageConfig:
    return to_typed(
        compose_stage("real_bench", [f"backend={backend}", "workload_dir=w", *overrides]),
        RealBenchStageConfig,
    )


def test_the_engine_gets_the_knobs_the_server_gets(compose_stage, tmp_path: Path) -> None:
    cmd = VllmBackend(_cfg(compose_stage, "vllm", *KNOBS)).server_command(8000, tmp_path)
    kwargs = VllmEngineBackend(_cfg(compose_stage, "vllm_engine", *KNOBS)).engine_kwargs(tmp_path)
    pairs = dict(itertools.pairwise(cmd))
    assert kwargs.pop("disable_log_stats") is False  # the engine's stamps need its stats
    for key, value in kwargs.items():
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            assert (flag if value else "--no-" + flag[2:]) in cmd, key
        else:
            assert pairs[flag] == str(value), key
    assert kwargs["max_num_batched_tokens"] == 512 and not kwargs["enable_chunked_prefill"]


def test_bad_input_is_refused_before_anything_starts(compose_stage) -> None:
    ok = [BenchRequest(0, 40, 2, 0.0, prompt_token_ids=tuple(range(40)))]
    with pytest.raises(ValueError, match="multiple of 32"):
        VllmEngineBackend(_cfg(compose_stage, "vllm_engine", "backend.block_size=16")).check(ok)
    with pytest.raises(ValueError, match="token-id prompts"):
        VllmEngineBackend(_cfg(compose_stage, "vllm_engine")).check(
            [BenchRequest(0, 5, 2, 0.0, prompt_text="hi")]
        )
    with pytest.raises(
        ConfigError, match=r"backend\.server\.extra_args is a knob of openai, vllm; "
    ):  # a server's flags: refused by the config already
        _cfg(compose_stage, "vllm_engine", "backend.server.extra_args=[--x]")
    cfg = _cfg(compose_stage, "vllm_engine")
    server = ServerConfig(extra_args=("--x",))
    flagged = dataclasses.replace(cfg, backend=VllmEngineBackendConfig(server=server))
    with pytest.raises(ValueError, match="extra_args"):  # and by the engine, built in Python
        VllmEngineBackend(flagged).check(ok)


class FakeEngine:
    """Stands in for ``AsyncLLM``: a token every ``step_s``, stamped like vLLM's engine core
    (``time.monotonic()``), with a request that never ends unless aborted."""

    def __init__(self, step_s: float = 0.002, hangs: tuple[str, ...] = ()) -> None:
        self.step_s = step_s
        self.hangs = hangs
        self.aborted: list[str] = []
        self.errored = False
        self.shut_down = False
        self.renderer = SimpleNamespace(render_cmpl_async=self._render)
        self.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=256))

    async def _render(self, prompts: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{"type": "token", **p} for p in prompts]

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        stats = SimpleNamespace(
            queued_ts=time.monotonic(),
            scheduled_ts=0.0,
            first_token_ts=0.0,
            last_token_ts=0.0,
            num_preemptions=0,
        )
        await asyncio.sleep(0.001)
        stats.scheduled_ts = time.monotonic()
        made = 0
        while made < params.max_tokens or request_id in self.hangs:
            if request_id in self.aborted:
                yield SimpleNamespace(outputs=[SimpleNamespace(token_ids=[])], metrics=stats)
                return
            await asyncio.sleep(self.step_s)
            if request_id in self.hangs:
                continue
            stats.first_token_ts = stats.first_token_ts or time.monotonic()
            stats.last_token_ts = time.monotonic()
            made += 1
            await asyncio.sleep(0.0005)  # the output's way to the client
            yield SimpleNamespace(
                outputs=[SimpleNamespace(token_ids=[7])], metrics=stats, num_cached_tokens=0
            )

    async def abort(self, request_id: str | list[str]) -> None:
        self.aborted += [request_id] if isinstance(request_id, str) else request_id

    def shutdown(self) -> None:
        self.shut_down = True


def _started(
    compose_stage, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, engine: FakeEngine
) -> VllmEngineBackend:
    async def create(self: VllmEngineBackend, kwargs: dict[str, Any]) -> FakeEngine:
        return engine

    monkeypatch.setattr(VllmEngineBackend, "_create", create)
    monkeypatch.setattr(
        "gpu_simulate_test.core.model.modeling.ensure_snapshot", lambda *a: tmp_path
    )
    backend = VllmEngineBackend(_cfg(compose_stage, "vllm_engine"))
    backend.log_dir = tmp_path
    return backend


def _requests(n: int, decode: int = 3) -> list[BenchRequest]:
    return [BenchRequest(i, 8, decode, 0.01 * i, prompt_token_ids=(1,) * 8) for i in range(n)]


def test_requests_go_through_the_loop_with_both_clocks(
    compose_stage, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    engine = FakeEngine()
    backend = _started(compose_stage, monkeypatch, tmp_path, engine)
    requests = _requests(4)
    recorder = Recorder(requests)
    os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
    threads = threading.active_count()
    backend.start(recorder)
    try:
        assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1"  # for the engine's processes
        backend.warmup(_requests(2))
        replay(backend, requests, recorder, request_timeout_s=10)
    finally:
        backend.close()
    assert engine.shut_down and "VLLM_CPU_KVCACHE_SPACE" not in os.environ
    assert threading.active_count() == threads  # the loop thread is gone
    import logging

    assert logging.getLogger(STEP_LOGGER).propagate  # vLLM's logging as it was
    table = request_frame(recorder.snapshot())
    assert (table.status == "ok").all() and (table.num_decode_tokens == 3).all()
    assert table.engine_ttft_s.notna().all() and table.engine_scheduling_delay_s.notna().all()
    assert (table.engine_arrival_time_s >= table.arrival_time_s).all()
    assert (table.engine_ttft_s <= table.ttft_s).all()
    assert (table.engine_e2e_s <= table.e2e_s).all()
    assert backend.clock_problems == []


def test_a_request_that_times_out_is_aborted_in_the_engine(
    compose_stage, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    engine = FakeEngine(hangs=("r1",))
    backend = _started(compose_stage, monkeypatch, tmp_path, engine)
    requests = _requests(2)
    recorder = Recorder(requests)
    backend.start(recorder)
    try:
        replay(backend, requests, recorder, request_timeout_s=0.3)
        deadline = time.monotonic() + 5
        while "r1" not in engine.aborted and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        backend.close()
    assert [r.status for r in recorder.snapshot()] == ["ok", "timeout"]
    assert engine.aborted == ["r1"]


def test_a_dead_engine_is_reported(
    compose_stage, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    engine = FakeEngine()
    backend = _started(compose_stage, monkeypatch, tmp_path, engine)
    backend.start(Recorder([]))
    try:
        assert backend.failure() is None
        engine.errored = True
        assert "engine core died" in (backend.failure() or "")
    finally:
        backend.close()
