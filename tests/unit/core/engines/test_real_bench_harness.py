"""The replay harness and the stage's fault handling, with a fake in-process backend."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pandas as pd
import pytest

from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.core.engines import BACKENDS, Backend, BackendError, get_backend
from gpu_simulate_test.core.engines.harness import replay, wait_until
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.io.schemas import REQUEST_METRICS, TOKEN_METRICS
from gpu_simulate_test.real_bench import stage

# sends are held to their schedule within milliseconds: run alone
pytestmark = pytest.mark.timing


class FakeBackend(Backend):
    """Answers each request from a thread: one token every ``itl_s``; can die or hang."""

    name: ClassVar[str] = "hf_cb"
    itl_s: ClassVar[float] = 0.002
    die_at_request: ClassVar[int | None] = None
    hang_request: ClassVar[int | None] = None
    interrupt_at_request: ClassVar[int | None] = None

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.dead: str | None = None
        self.closed_with: bool | None = None
        self.cancelled: list[int] = []

    def start(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def warmup(self, requests: Sequence[BenchRequest]) -> None:
        pass

    def submit(self, request: BenchRequest) -> None:
        self.recorder.arrived(request.request_id, time.perf_counter())
        if request.request_id == self.interrupt_at_request:
            raise KeyboardInterrupt
        if request.request_id == self.die_at_request:
            self.dead = "server process exited (code -9)"
            return
        threading.Thread(target=self._answer, args=(request,), daemon=True).start()

    def _answer(self, request: BenchRequest) -> None:
        if request.request_id == self.hang_request:
            return
        for _ in range(request.num_decode_tokens):
            time.sleep(self.itl_s)
            self.recorder.tokens(request.request_id, time.perf_counter())
        self.recorder.finish(request.request_id, "ok")

    def cancel(self, request_id: int) -> None:
        self.cancelled.append(request_id)

    def failure(self) -> str | None:
        return self.dead

    def close(self, abort: bool = False) -> None:
        self.closed_with = abort


def requests(n: int = 5, gap: float = 0.01, decode: int = 3) -> list[BenchRequest]:
    return [BenchRequest(i, 4, decode, i * gap, prompt_token_ids=(1, 2, 3, 4)) for i in range(n)]


def test_wait_until_is_on_time() -> None:
    target = time.perf_counter() + 0.02
    woke = wait_until(target)
    assert 0 <= woke - target < 0.005


def test_replay_sends_on_schedule_and_collects_every_token() -> None:
    reqs = requests(6, gap=0.02)
    recorder = Recorder(reqs)
    backend = FakeBackend()
    backend.start(recorder)
    outcome = replay(backend, reqs, recorder, request_timeout_s=5)
    assert outcome.num_sent == 6
    records = recorder.snapshot()
    assert all(r.status == "ok" and r.num_decode_tokens == 3 for r in records)
    for rec in records:
        assert rec.arrival_s is not None
        assert 0 <= rec.arrival_s - rec.scheduled_arrival_s < 0.01  # loose: a shared CI box
        assert rec.event_times_s == sorted(rec.event_times_s)
        assert rec.event_times_s[0] > rec.arrival_s


def test_a_request_that_hangs_times_out_and_is_cancelled() -> None:
    reqs = requests(3)
    recorder = Recorder(reqs)
    backend = type("Hanging", (FakeBackend,), {"hang_request": 1})()
    backend.start(recorder)
    replay(backend, reqs, recorder, request_timeout_s=0.2)
    statuses = [r.status for r in recorder.snapshot()]
    assert statuses == ["ok", "timeout", "ok"]
    assert backend.cancelled == [1]


def test_a_dead_backend_ends_the_replay_with_in_flight_requests_failed() -> None:
    reqs = requests(4, gap=0.2, decode=50)
    recorder = Recorder(reqs)
    backend = type("Dying", (FakeBackend,), {"die_at_request": 2, "itl_s": 0.01})()
    backend.start(recorder)
    with pytest.raises(BackendError, match="died mid-run"):
        replay(backend, reqs, recorder, request_timeout_s=5)
    records = recorder.snapshot()
    assert records[2].status == "error" and "engine died" in records[2].error
    assert records[3].arrival_s is None  # never sent


def test_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="hf_cb, hf_generate, openai"):
        get_backend("tgi")


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_backend_honours_the_base_signature(name: str) -> None:
    cls = BACKENDS[name]
    assert cls.name == name and issubclass(cls, Backend)
    for method in ("check", "start", "warmup", "submit", "cancel", "failure", "close", "describe"):
        base = inspect.signature(getattr(Backend, method))
        impl = inspect.signature(getattr(cls, method))
        assert list(impl.parameters) == list(base.parameters), f"{name}.{method}"


# ---------------------------------------------------------------------------------- the stage
@pytest.fixture
def workload_dir(tmp_path: Path) -> Path:
    """A tiny complete workload run written through the workload stage's library code."""
    from gpu_simulate_test.config.schema import WorkloadStageConfig
    from gpu_simulate_test.workload.stage import run as build

    cfg = WorkloadStageConfig(
        model=_tiny_model(),
        output=_output(tmp_path, "w"),
        progress=False,
    )
    from dataclasses import replace

    cfg = replace(cfg, workload=replace(cfg.workload, num_requests=6, qps=10.0))
    return build(cfg, {"workload": "tiny"})


def _tiny_model() -> Any:
    from omegaconf import OmegaConf

    from gpu_simulate_test.config.registry import CONFIG_DIR
    from gpu_simulate_test.config.schema import ModelConfig

    loaded = OmegaConf.load(CONFIG_DIR / "model" / "qwen3_tiny.yaml")
    return to_typed(loaded, ModelConfig)  # type: ignore[arg-type]


def _output(tmp_path: Path, run_id: str) -> Any:
    from gpu_simulate_test.config.schema import OutputConfig

    return OutputConfig(root=str(tmp_path / "tmp"), run_id=run_id)


def _bench_cfg(compose_stage, tmp_path: Path, workload: Path, *extra: str) -> RealBenchStageConfig:
    cfg = compose_stage(
        "real_bench",
        [
            f"workload_dir={workload}",
            f"output.root={tmp_path / 'tmp'}",
            "output.run_id=b",
            "progress=false",
            "num_warmup_requests=0",
            *extra,
        ],
    )
    return to_typed(cfg, RealBenchStageConfig)


def test_stage_writes_partial_results_and_marks_failed_when_the_server_dies(
    compose_stage, tmp_path: Path, workload_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dying = type("Dying", (FakeBackend,), {"die_at_request": 3})
    monkeypatch.setattr(stage, "get_backend", lambda name: dying)
    cfg = _bench_cfg(compose_stage, tmp_path, workload_dir)
    with pytest.raises(BackendError):
        stage.run(cfg, {"x": 1})
    run = tmp_path / "tmp" / "real_bench" / "b"
    meta = read_json(run / layout.RUN_META)
    assert meta["status"] == "failed" and "died mid-run" in meta["error"]
    assert (run / layout.INCOMPLETE_MARKER).exists()
    frame = read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)
    assert len(frame) == 4  # requests 0..3 arrived; 4, 5 were never sent
    assert frame.loc[frame.request_id == 3, "status"].item() == "error"
    assert read_json(run / stage.SUMMARY)["num_not_sent"] == 2


def test_stage_writes_what_was_measured_and_marks_interrupted_on_ctrl_c(
    compose_stage, tmp_path: Path, workload_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    interrupted = type("Interrupted", (FakeBackend,), {"interrupt_at_request": 4})
    monkeypatch.setattr(stage, "get_backend", lambda name: interrupted)
    cfg = _bench_cfg(compose_stage, tmp_path, workload_dir)
    with pytest.raises(KeyboardInterrupt):
        stage.run(cfg, {"x": 1})
    run = tmp_path / "tmp" / "real_bench" / "b"
    assert read_json(run / layout.RUN_META)["status"] == "interrupted"
    frame = read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)
    assert frame.loc[frame.request_id == 4, "status"].item() == "cancelled"
    tokens = read_csv(run / layout.TOKEN_METRICS, TOKEN_METRICS)
    assert set(tokens.request_id) <= set(range(4))


def test_stage_completes_with_a_healthy_backend(
    compose_stage, tmp_path: Path, workload_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stage, "get_backend", lambda name: FakeBackend)
    cfg = _bench_cfg(compose_stage, tmp_path, workload_dir)
    path = stage.run(cfg, {"x": 1})
    frame = pd.read_csv(path / layout.REQUEST_METRICS)
    assert (frame.status == "ok").all() and len(frame) == 6
    assert read_json(path / layout.RUN_META)["status"] == "complete"
    assert not (path / stage.TELEMETRY_CSV).exists()  # no GPU, no telemetry file
    # vllm bench serve's request_rate is --request-rate, the rate the workload was told (its
    # 6 Poisson arrivals realized another); the export of this run says the same
    realized = read_json(workload_dir / layout.WORKLOAD_META)["summary"]["mean_qps"]
    assert realized != pytest.approx(10.0)
    assert read_json(path / stage.SUMMARY)["request_rate"] == 10.0


def test_start_and_warm_up_are_said_before_the_replay_bar(
    compose_stage,
    tmp_path: Path,
    workload_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A vLLM server takes a minute to start and its shape warm-up seconds more: the stage says
    what it is doing then, not nothing until the replay's bar."""
    monkeypatch.setattr(stage, "get_backend", lambda name: FakeBackend)
    cfg = _bench_cfg(compose_stage, tmp_path, workload_dir, "progress=true")
    stage.run(cfg, {"x": 1})
    out = capsys.readouterr().out
    started, warming, done = (
        out.index("starting hf_cb (qwen3_tiny on cpu)"),
        out.index("hf_cb started in"),
        out.index("warm-up done in"),
    )
    assert started < warming < done < out.index("replaying")
    assert "warming up" in out[warming:done]


def test_the_shape_warm_up_leaves_out_the_sizes_the_engine_has_run(
    compose_stage, tmp_path: Path, workload_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[BenchRequest] = []

    class Warm(FakeBackend):
        def sizes_run(self) -> frozenset[int]:
            return frozenset({1, 2, 3})

        def warmup(self, requests: Sequence[BenchRequest]) -> None:
            sent.extend(requests)

    monkeypatch.setattr(stage, "get_backend", lambda name: Warm)
    path = stage.run(_bench_cfg(compose_stage, tmp_path, workload_dir), {"x": 1})
    meta = read_json(path / layout.RUN_META)
    sizes = [r.num_prefill_tokens for r in sent]
    assert meta["num_shape_warmups"] > 3 and meta["shape_warmups_skipped"] == 3
    assert len(sizes) == meta["num_shape_warmups"] - 3 and not {1, 2, 3} & set(sizes)
    assert all(r.num_decode_tokens == 1 for r in sent)


def test_context_and_kv_cache_checks_fail_before_the_run_exists(
    compose_stage, tmp_path: Path, workload_dir: Path
) -> None:
    cfg = _bench_cfg(compose_stage, tmp_path, workload_dir, "model.max_position_embeddings=8")
    with pytest.raises(ValueError, match=r"over model qwen3_tiny's context of 8 tokens"):
        stage.run(cfg, {"x": 1})
    cfg = _bench_cfg(
        compose_stage,
        tmp_path,
        workload_dir,
        "backend.num_gpu_blocks_override=1",
        "backend.block_size=4",
    )
    with pytest.raises(ValueError, match=r"raise backend\.num_gpu_blocks_override"):
        stage.run(cfg, {"x": 1})
    assert not (tmp_path / "tmp" / "real_bench").exists()
