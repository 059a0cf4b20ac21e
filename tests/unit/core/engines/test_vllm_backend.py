"""The vLLM backend's pieces on real vLLM output: step-log and /metrics parsing, token counting,
knobs, up-front checks, and the server process manager on real processes."""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.core.engines import server as server_module
from gpu_simulate_test.core.engines.openai import event_tokens
from gpu_simulate_test.core.engines.records import BenchRequest
from gpu_simulate_test.core.engines.server import (
    LogFollower,
    ManagedServer,
    ServerError,
    free_loopback_port,
    start_on_loopback,
)
from gpu_simulate_test.core.engines.vllm import VllmBackend
from gpu_simulate_test.core.engines.vllm_knobs import cpu_threads_bind, prefix_sharing
from gpu_simulate_test.core.engines.vllm_log import (
    StepLineError,
    StepLog,
    metric_total,
    metrics_delta,
    parse_iteration_line,
    parse_metrics,
)
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv
from gpu_simulate_test.io.schemas import ENGINE_STEP_LOG
from gpu_simulate_test.orchestrate.profiling import engine_identity
from tests.conftest import vllm_stage_config

DATA = Path(__file__).resolve().parents[3] / "data" / "vllm"


def _feed_fixture_log() -> StepLog:
    log = StepLog()
    for i, line in enumerate((DATA / "server_q06b_iterations.log").read_text().splitlines()):
        log.feed(line, float(i))
    return log


def test_every_step_line_of_a_real_server_log_is_parsed() -> None:
    log = _feed_fixture_log()
    assert len(log.steps) == 520
    assert [s.step_index for _, s in log.steps] == list(range(520))
    first = log.steps[0][1]
    assert (first.num_prefill_requests, first.num_prefill_tokens) == (1, 128)
    assert (first.num_decode_requests, first.num_decode_tokens) == (0, 0)
    assert first.elapsed_ms == pytest.approx(155.76) and first.kv_cache_usage_pct == 0.3
    assert log.version == "0.32.0" and log.kv_cache_tokens == 37376


def test_step_frame_keeps_steps_after_the_replay_started_on_the_run_clock() -> None:
    log = _feed_fixture_log()
    lines_before_first_step = log.steps[0][0]
    frame = log.frame(origin=100.0, since=lines_before_first_step + 10)
    assert len(frame) == 510 and frame["step_index"].iloc[0] == 10
    assert frame["time_s"].iloc[0] == pytest.approx(lines_before_first_step + 10 - 100.0)


def test_non_step_lines_are_not_steps() -> None:
    assert parse_iteration_line("INFO: 127.0.0.1 - POST /v1/completions 200 OK") is None
    step = parse_iteration_line(
        "Engine 000: Iteration(7): 2 context requests, 300 context tokens, 5 generation "
        "requests, 5 generation tokens, iteration elapsed time: 12.5 ms"
    )
    assert step is not None and step.kv_cache_usage_pct is None and step.num_decode_requests == 5


def test_a_data_parallel_server_s_step_lines_say_their_engine() -> None:
    """A ``--data-parallel-size 2`` server logs each engine's steps as ``Engine 00k:``; the step
    log table gets an ``engine`` column for a fleet only."""
    log = StepLog()
    lines = (DATA / "step_record_dp2" / "server_iteration_lines.log").read_text().splitlines()
    for i, line in enumerate(lines):
        log.feed(line, float(i))
    assert [s.engine for _, s in log.steps] == [0] * 5 + [1] * 5
    assert list(log.frame(0.0, 0.0, engines=2)["engine"]) == [0] * 5 + [1] * 5
    assert "engine" not in log.frame(0.0, 0.0).columns


def test_the_sizes_a_server_ran_are_read_off_its_step_lines_on_every_engine() -> None:
    """What the real bench's shape warm-up leaves out: a size counts once every engine of the
    server ran a step of it (prompt plus decode tokens)."""
    log = _feed_fixture_log()
    expected = {s.num_prefill_tokens + s.num_decode_tokens for _, s in log.steps}
    assert log.sizes() == expected and 128 in expected
    dp = StepLog()
    lines = (DATA / "step_record_dp2" / "server_iteration_lines.log").read_text().splitlines()
    one = "1 generation requests, 1 generation tokens"  # engine 0 also ran a step of 2 tokens
    lines[0] = lines[0].replace(one, "2 generation requests, 2 generation tokens")
    for i, line in enumerate(lines):
        dp.feed(line, float(i))
    per_engine = [
        {s.num_prefill_tokens + s.num_decode_tokens for _, s in dp.steps if s.engine == e}
        for e in (0, 1)
    ]
    assert per_engine[0] != per_engine[1]  # else the test could not tell one from both
    assert dp.sizes(2) == per_engine[0] & per_engine[1]
    assert dp.sizes(1) == per_engine[0]


def test_only_a_server_whose_log_this_process_read_from_its_start_says_its_sizes(
    compose_stage, tmp_path: Path
) -> None:
    owner = VllmBackend(vllm_stage_config(compose_stage))  # starts its own server: read from birth
    owner.steps = _feed_fixture_log()
    assert owner.sizes_run() == owner.steps.sizes() != frozenset()
    log = tmp_path / "server.log"
    shared = VllmBackend(
        vllm_stage_config(
            compose_stage, "backend.server.kind=external", f"backend.server.log_file={log}"
        )
    )
    shared.log_path = log
    shared.steps = owner.steps
    assert shared.sizes_run() == frozenset()  # a file followed from elsewhere: unknown
    VllmBackend._live_logs[log.resolve()] = owner.steps  # the pipeline's own server
    try:
        assert shared.sizes_run() == owner.steps.sizes()
    finally:
        VllmBackend._live_logs.pop(log.resolve())


def changed_format_lines() -> list[str]:
    """Two step lines of the real log as a vLLM whose format changed would print them: the
    prefill counts renamed, and a line cut short before its time."""
    real = [line for line in _fixture_lines() if "Iteration(" in line]
    renamed = real[99].replace("context requests", "prefill requests")
    cut = real[100][: real[100].index("iteration elapsed")]
    return [renamed, cut]


def _fixture_lines() -> list[str]:
    return (DATA / "server_q06b_iterations.log").read_text().splitlines()


def test_a_step_line_the_parser_cannot_read_is_counted_and_quoted() -> None:
    log = _feed_fixture_log()
    assert log.unreadable_since(0.0) == (0, [])  # every real step line is read
    changed = changed_format_lines()
    for line in changed:
        log.feed(line, 1000.0)
    assert len(log.steps) == 520
    assert log.unreadable_since(0.0) == (2, changed)
    assert log.unreadable_since(1000.5) == (0, [])  # a replay that started later saw none
    with pytest.raises(StepLineError, match="prefill requests"):
        parse_iteration_line(changed[0])


def test_a_run_records_the_step_lines_it_could_not_read(compose_stage, tmp_path: Path) -> None:
    backend = VllmBackend(vllm_stage_config(compose_stage))
    for i, line in enumerate([*_fixture_lines(), *changed_format_lines()]):
        backend.steps.feed(line, float(i))
    engine_log = backend.write_artifacts(tmp_path, origin=0.0, since=0.0)
    assert engine_log["engine_steps"] == 520 and engine_log["unreadable_step_lines"] == 2
    assert engine_log["unreadable_step_line_examples"] == changed_format_lines()
    assert len(read_csv(tmp_path / layout.ENGINE_STEP_LOG, ENGINE_STEP_LOG)) == 520
    # a server run elsewhere without its log file: no step log, and none claimed
    elsewhere = tmp_path / "external"
    elsewhere.mkdir()
    external = VllmBackend(vllm_stage_config(compose_stage, "backend.server.kind=external"))
    assert external.write_artifacts(elsewhere, 0.0, 0.0)["engine_steps"] is None
    assert not (elsewhere / layout.ENGINE_STEP_LOG).exists()


def test_a_failing_line_hook_is_stopped_said_and_fails_the_run(
    compose_stage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[str] = []

    def hook(line: str, _at: float) -> None:
        seen.append(line)
        if line == "two":
            raise RuntimeError("parser bug")

    script = "print('one'); print('two'); print('three')"
    server = ManagedServer([sys.executable, "-c", script], tmp_path / "s.log", hook=hook)
    server.start()
    assert server.process is not None
    server.process.wait(30)
    server.stop()
    assert (tmp_path / "s.log").read_text().split() == ["one", "two", "three"]  # still copied
    assert seen == ["one", "two"]
    assert server.hook is not None and server.hook.error == (
        "RuntimeError: parser bug (on the line 'two')"
    )
    assert "line hook failed" in capsys.readouterr().out
    backend = VllmBackend(vllm_stage_config(compose_stage))
    backend.server = server
    assert backend.failure() == (
        "reading the server's step log failed: RuntimeError: parser bug (on the line 'two')"
    )


def test_metrics_of_a_real_server_are_parsed_by_prometheus_parser() -> None:
    samples = parse_metrics((DATA / "metrics_tiny.prom").read_text())
    assert metric_total(samples, "vllm:prompt_tokens_total") == 2437.0
    assert metric_total(samples, "vllm:request_queue_time_seconds_count") == 20.0
    assert metric_total(samples, "vllm:no_such_metric") is None
    before = {k: 0.0 for k in samples}
    delta = metrics_delta(before, samples)
    assert delta["vllm:prefix_cache_hits_total"] == 0.0
    assert delta["mean_queue_time_ms"] == pytest.approx(0.000770412000235865 / 20 * 1000)
    ttft_sum = metric_total(samples, "vllm:time_to_first_token_seconds_sum")
    assert ttft_sum is not None and delta["mean_ttft_ms"] == pytest.approx(ttft_sum / 20 * 1000)
    assert delta["mean_e2e_ms"] is not None and delta["mean_e2e_ms"] > delta["mean_ttft_ms"]


def test_tokens_are_counted_from_token_ids_not_chunks() -> None:
    assert event_tokens({"text": "ab", "token_ids": [5, 6, 7]}) == 3
    assert event_tokens({"text": "", "token_ids": []}) == 0
    assert event_tokens({"text": "x"}) == 1
    assert event_tokens({"text": ""}) == 0


def _req(rid: int, ids: tuple[int, ...], out: int = 4) -> BenchRequest:
    return BenchRequest(rid, len(ids), out, 0.0, prompt_token_ids=ids)


def test_prefix_sharing_counts_requests_whose_first_block_was_seen() -> None:
    a = tuple(range(40))
    b = tuple(range(32)) + (99,) * 8  # same first block of 32 as a
    c = tuple(range(1, 41))
    short = tuple(range(10))  # under one block: nothing to share
    assert prefix_sharing([_req(0, a), _req(1, b), _req(2, c), _req(3, short)], 32) == 1
    assert prefix_sharing([_req(0, a), _req(1, c)], 32) == 0


@pytest.mark.parametrize(("cpus", "expected"), [(1, "0"), (2, "1"), (4, "1-3")])
def test_auto_thread_binding_leaves_core_zero_to_the_client(cpus: int, expected: str) -> None:
    assert cpu_threads_bind("auto", cpus) == expected
    assert cpu_threads_bind("0-1", cpus) == "0-1"


@pytest.mark.parametrize(
    ("cpus", "ranks", "expected"),
    [(2, 2, "0|1"), (3, 2, "1|2"), (5, 2, "1-2|3-4"), (6, 2, "1-3|4-5"), (9, 4, "1-2|3-4|5-6|7-8")],
)
def test_data_parallel_engines_get_cores_of_their_own(cpus: int, ranks: int, expected: str) -> None:
    """One group of cores per rank, ``|`` between them (vLLM's format); core 0 left to the
    client only where more cores than ranks remain."""
    assert cpu_threads_bind("auto", cpus, ranks) == expected
    with pytest.raises(ValueError, match=r"data_parallel_size=4: .* 2 core"):
        cpu_threads_bind("auto", 2, 4)


def test_server_command_carries_the_knobs_vidur_gets(compose_stage, tmp_path: Path) -> None:
    backend = VllmBackend(vllm_stage_config(compose_stage, "backend.max_num_batched_tokens=512"))
    cmd = backend.server_command(8000, tmp_path)
    pairs = dict(itertools.pairwise(cmd))
    assert pairs["--max-num-batched-tokens"] == "512"
    assert pairs["--max-num-seqs"] == "32" and pairs["--block-size"] == "32"
    assert pairs["--num-gpu-blocks-override"] == "256" and pairs["--host"] == "127.0.0.1"
    assert "--no-enable-prefix-caching" in cmd and "--enable-logging-iteration-details" in cmd
    assert pairs["--dtype"] == "float32" and pairs["--served-model-name"] == "qwen3_tiny"
    env = backend.server_env()
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["PYTHONUNBUFFERED"] == "1"
    assert "--data-parallel-size" not in cmd
    assert "--gpu-memory-utilization" not in cmd  # on CPU the KV cache is VLLM_CPU_KVCACHE_SPACE


def test_on_a_gpu_the_server_takes_its_share_of_the_memory(compose_stage, tmp_path: Path) -> None:
    """``backend.gpu_memory_utilization`` reaches the server and the in-process engine alike
    on CUDA (several servers on one GPU each take a share)."""
    from gpu_simulate_test.core.engines.vllm_engine import VllmEngineBackend

    cfg = vllm_stage_config(compose_stage, "hardware=h100", "backend.gpu_memory_utilization=0.45")
    pairs = dict(itertools.pairwise(VllmBackend(cfg).server_command(8000, tmp_path)))
    assert pairs["--gpu-memory-utilization"] == "0.45" and pairs["--dtype"] == "bfloat16"
    engine = to_typed(
        compose_stage(
            "real_bench",
            ["backend=vllm_engine", "workload_dir=w", "hardware=h100",
             "backend.gpu_memory_utilization=0.45"],
        ),
        RealBenchStageConfig,
    )  # fmt: skip
    assert VllmEngineBackend(engine).engine_kwargs(tmp_path)["gpu_memory_utilization"] == 0.45
    with pytest.raises(ValueError, match=r"gpu_memory_utilization=1.5 must be in \(0, 1\]"):
        vllm_stage_config(compose_stage, "backend.gpu_memory_utilization=1.5")


def test_a_data_parallel_server_has_one_api_server(compose_stage, tmp_path: Path) -> None:
    backend = VllmBackend(vllm_stage_config(compose_stage, "backend.data_parallel_size=2"))
    pairs = dict(itertools.pairwise(backend.server_command(8000, tmp_path)))
    assert pairs["--data-parallel-size"] == "2" and pairs["--api-server-count"] == "1"
    assert "|" in backend.server_env()["VLLM_CPU_OMP_THREADS_BIND"]
    with pytest.raises(ValueError, match="data_parallel_size must be >= 1"):
        vllm_stage_config(compose_stage, "backend.data_parallel_size=0")


def test_runs_nested_in_a_stage_share_the_outer_snapshot_and_vllm_cache(
    compose_stage, tmp_path: Path
) -> None:
    import dataclasses

    from gpu_simulate_test.config.schema import OutputConfig, nested_output, shared_root

    cfg = vllm_stage_config(compose_stage, f"output.root={tmp_path}")
    alone = VllmBackend(cfg).server_env()
    assert alone["VLLM_CACHE_ROOT"] == str((tmp_path / "cache" / "vllm").resolve())
    outer = OutputConfig(root=str(tmp_path))
    one = nested_output(outer, tmp_path / "tune" / "t" / "runs" / "s8-t128")
    two = nested_output(nested_output(outer, tmp_path / "capacity" / "c" / "runs"), "deeper")
    assert shared_root(one) == shared_root(two) == tmp_path  # nested twice: still the outer
    assert one.overwrite and one.root.endswith("s8-t128")
    nested = VllmBackend(dataclasses.replace(cfg, output=one)).server_env()
    assert nested["VLLM_CACHE_ROOT"] == alone["VLLM_CACHE_ROOT"]  # not under runs/s8-t128


def test_bad_input_is_refused_before_anything_starts(compose_stage, tmp_path: Path) -> None:
    ok = [_req(0, tuple(range(40)))]
    with pytest.raises(ValueError, match="multiple of 32"):
        VllmBackend(vllm_stage_config(compose_stage, "backend.block_size=16")).check(ok)
    long = [_req(3, tuple(range(100)), out=4000)]
    with pytest.raises(ValueError, match="request 3 needs 100 prompt"):
        VllmBackend(vllm_stage_config(compose_stage)).check(long)
    with pytest.raises(ValueError, match="token-id prompts"):
        VllmBackend(vllm_stage_config(compose_stage)).check(
            [BenchRequest(0, 5, 2, 0.0, prompt_text="hi")]
        )
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="no tokenizer"):
        VllmBackend(vllm_stage_config(compose_stage, f"model.local_path={tmp_path}")).check(ok)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(ValueError, match="already in use"):
            VllmBackend(vllm_stage_config(compose_stage, f"backend.server.port={port}")).check(ok)


SERVE = textwrap.dedent(
    """
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
    """
)
"""A health endpoint on the port in ``argv[1]`` (after ``import http.server, sys``)."""

HEALTHY_SERVER = (
    textwrap.dedent(
        """
        import http.server, subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        print("child", child.pid, flush=True)
        """
    )
    + SERVE
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def test_managed_server_waits_for_health_and_stops_its_whole_group(tmp_path: Path) -> None:
    port = free_loopback_port()
    lines: list[str] = []
    server = ManagedServer(
        [sys.executable, "-c", HEALTHY_SERVER, str(port)],
        tmp_path / "server.log",
        hook=lambda line, _at: lines.append(line),
    )
    server.start()
    try:
        server.wait_healthy(f"http://127.0.0.1:{port}/health", 30)
        assert server.failure() is None
        deadline = time.monotonic() + 10
        while not lines and time.monotonic() < deadline:
            time.sleep(0.05)
        child = int(lines[0].split()[1])
        assert _alive(child)
        # a process group of its own (stopped as one), in this session: one autogroup with the
        # client, so vLLM's spinning engine core cannot hold the client's core across groups
        assert server.pid is not None and os.getpgid(server.pid) == server.pid != os.getpgid(0)
        assert os.getsid(server.pid) == os.getsid(0)
    finally:
        server.stop()
    assert server.failure() is not None
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the server's child outlived the stop"
    assert "child" in (tmp_path / "server.log").read_text()


def test_a_server_that_dies_at_start_reports_its_root_cause(tmp_path: Path) -> None:
    script = "import sys; print('loading'); print('ValueError: No common block size'); sys.exit(3)"
    server = ManagedServer([sys.executable, "-c", script], tmp_path / "s.log")
    server.start()
    with pytest.raises(ServerError, match=r"exited with code 3 \(ValueError: No common block size"):
        server.wait_healthy("http://127.0.0.1:9/health", 30)
    server.stop()


def test_a_warning_naming_an_error_is_not_taken_for_the_root_cause(tmp_path: Path) -> None:
    # vLLM 0.32's first lines when it cannot raise the open-files limit, then the real cause
    log = tmp_path / "s.log"
    log.write_text(
        "(APIServer pid=1) WARNING 11-23 20:03:14 [system_utils.py:255] Found ulimit of 20000 "
        "and failed to automatically increase with error current limit exceeds maximum limit. "
        "This can cause fd limit errors like `OSError: [Errno 24] Too many open files`. "
        "Consider increasing with ulimit -n\n"
        "(EngineCore pid=2) ERROR 11-23 20:03:53 [core.py:1510] ValueError: To serve at least "
        "one request with the model's max seq len (40960), (4.38 GiB KV cache is needed\n"
    )
    server = ManagedServer([sys.executable, "-c", "pass"], log)
    assert (server.first_error() or "").startswith("ValueError: To serve at least one request")


def test_max_model_len_defaults_to_what_the_kv_cache_holds(compose_stage) -> None:
    # 256 blocks of 32 tokens, one kept back by vLLM: 8,160, under Qwen3-0.6B's 40,960 positions
    big = VllmBackend(vllm_stage_config(compose_stage, "model=qwen3_0_6b"))
    assert big.max_model_len == 8160
    tiny = VllmBackend(vllm_stage_config(compose_stage))  # its 4,096 positions fit
    assert tiny.max_model_len == 4096
    assert (
        VllmBackend(vllm_stage_config(compose_stage, "backend.max_model_len=2048")).max_model_len
        == 2048
    )


def test_log_follower_reads_only_what_is_appended_after_it_starts(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("old line, before the follower\n")
    seen: list[str] = []
    follower = LogFollower(log, lambda line, _at: seen.append(line))
    follower.start()
    with log.open("a") as handle:
        handle.write("Engine 000: Iteration(3): 0 context requests, 0 context tokens, ")
        handle.flush()
        time.sleep(0.05)  # a line written in two pieces is read as one
        handle.write("1 generation requests, 1 generation tokens, iteration elapsed time: 2.0 ms\n")
        handle.write("another\n")
    time.sleep(0.1)
    follower.stop()
    assert len(seen) == 2 and seen[1] == "another"
    step = parse_iteration_line(seen[0])
    assert step is not None and step.step_index == 3 and step.elapsed_ms == 2.0


def test_a_calibration_through_the_pipelines_own_server_stands_for_the_engine() -> None:
    started_here = {
        "name": "vllm",
        "block_size": 32,
        "base_url": "http://127.0.0.1:8000",
        "server": {"kind": "vllm"},
        "served_model_name": None,
    }
    shared = {
        **started_here,
        "base_url": "http://127.0.0.1:41234",
        "server": {"kind": "external", "log_file": "tmp/pipeline/x/server.log"},
        "served_model_name": "qwen3_tiny",
    }
    assert engine_identity(started_here) == engine_identity(shared)
    assert engine_identity({**shared, "block_size": 64}) != engine_identity(started_here)


def test_sender_pool_runs_any_number_of_requests_at_once() -> None:
    """20 sends that each wait for all 20 to have started: only possible if none waits for a
    free thread (the pool grows its spares as they are taken)."""
    import threading

    from gpu_simulate_test.core.engines.openai import SenderPool

    barrier = threading.Barrier(20, timeout=20)
    done: list[int] = []

    def send(req: BenchRequest) -> None:
        barrier.wait()
        done.append(req.request_id)

    pool = SenderPool(send, spare=4)
    pool.start()
    for i in range(20):
        pool.put(_req(i, (1, 2, 3)))
    deadline = time.monotonic() + 20
    while len(done) < 20 and time.monotonic() < deadline:
        time.sleep(0.01)
    pool.stop()
    assert sorted(done) == list(range(20))


@contextlib.contextmanager
def _a_sender_thread() -> Iterator[int]:
    """A thread started before the block, as the spare senders are: its native id."""
    import threading

    started, stop = threading.Event(), threading.Event()
    native: list[int] = []

    def sender() -> None:
        native.append(threading.get_native_id())
        started.set()
        stop.wait(10)

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    started.wait(5)
    try:
        yield native[0]
    finally:
        stop.set()
        thread.join(5)


def test_the_client_pins_every_thread_of_its_process_and_gives_them_back() -> None:
    from gpu_simulate_test.core.engines.harness import cpu_affinity

    cpus = sorted(os.sched_getaffinity(0))
    with _a_sender_thread() as sender:
        with cpu_affinity({cpus[0]}):
            held = os.sched_getaffinity(sender)
            threads = os.listdir("/proc/self/task")
            assert held == {cpus[0]}, f"sender {sender} on {held}; threads {threads}"
            assert os.sched_getaffinity(0) == {cpus[0]}
        assert os.sched_getaffinity(sender) == set(cpus)
        assert os.sched_getaffinity(0) == set(cpus)


def test_a_thread_listing_that_fails_once_still_pins_every_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpu_simulate_test.core.engines import harness

    cpus = sorted(os.sched_getaffinity(0))
    real_listdir = os.listdir
    failed: list[str] = []

    def listdir_once_out_of_descriptors(path: str) -> list[str]:
        if path == "/proc/self/task" and not failed:
            failed.append(path)
            raise OSError(24, "Too many open files")
        return real_listdir(path)

    with _a_sender_thread() as sender:
        monkeypatch.setattr(harness.os, "listdir", listdir_once_out_of_descriptors)
        with harness.cpu_affinity({cpus[0]}):
            assert failed
            assert os.sched_getaffinity(sender) == {cpus[0]}
        assert os.sched_getaffinity(sender) == set(cpus)


def _state(pid: int) -> str:
    """The process's state letter in ``/proc/<pid>/stat`` (``T``: stopped)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_a_paused_server_is_stopped_until_resumed_and_a_paused_one_still_stops(
    tmp_path: Path,
) -> None:
    # the tune's batched starts freeze the servers waiting their turn (SIGSTOP on the group)
    script = "import time\nwhile True: time.sleep(0.05)"
    server = ManagedServer([sys.executable, "-c", script], tmp_path / "s.log")
    server.start()
    assert server.process is not None
    pid = server.process.pid
    try:
        server.pause()
        deadline = time.monotonic() + 10
        while _state(pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _state(pid) == "T"
        server.resume()
        deadline = time.monotonic() + 10
        while _state(pid) == "T" and time.monotonic() < deadline:
            time.sleep(0.05)
        # running, sleeping, or waiting on I/O (D, a loaded machine paging it back in): not
        # stopped (T)
        assert _state(pid) in {"S", "R", "D"}
        server.pause()
    finally:
        server.stop()  # SIGTERM reaches a paused group too (SIGCONT after it)
    assert server.process.poll() is not None and server.process.returncode == -15


def test_a_paused_server_that_does_not_answer_again_fails_as_a_start_does(
    tmp_path: Path,
) -> None:
    # the tune reads a BackendError as that configuration's failed check, and goes on
    from types import SimpleNamespace

    from gpu_simulate_test.core.engines.base import BackendError
    from gpu_simulate_test.orchestrate.serving import EarlyServer

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    script = "import time; time.sleep(60)"
    server = ManagedServer([sys.executable, "-c", script], tmp_path / "s.log")
    server.start()
    early = EarlyServer.__new__(EarlyServer)
    early.paused = True
    early.backend = SimpleNamespace(  # type: ignore[assignment]
        server=server,
        base_url=f"http://127.0.0.1:{port}",
        knobs=SimpleNamespace(server=SimpleNamespace(startup_timeout_s=1.0)),
    )
    try:
        server.pause()
        with pytest.raises(BackendError, match="the paused server did not answer again"):
            early.resume()
        assert not early.paused
    finally:
        server.stop()


LONE_SERVER = (
    textwrap.dedent(
        """
        import http.server, sys
        print("INFO ImportError: an unrelated error named first", flush=True)
        """
    )
    + SERVE
)
"""A server with no child holding its output open; an error line before any Errno 98."""


def test_a_picked_port_taken_before_the_server_binds_it_is_picked_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # another process takes the picked port in the seconds before the server binds it (a slow
    # tier run lost a fleet's server so): the server starts again on another port, said
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        free = free_loopback_port()
        picks = iter([busy, free])
        monkeypatch.setattr(server_module, "free_loopback_port", lambda: next(picks))
        seen: list[tuple[ManagedServer, int]] = []
        log = tmp_path / "server.log"
        took = start_on_loopback(
            lambda port: [sys.executable, "-c", LONE_SERVER, str(port)],
            log,
            None,
            None,
            30,
            started=lambda server, port: seen.append((server, port)),
        )
        try:
            assert took > 0
            assert [port for _, port in seen] == [busy, free]
            assert seen[0][0].failure() is not None and seen[1][0].failure() is None
            assert "Errno 98" in (tmp_path / "server.log.attempt-1").read_text()
            assert "Errno 98" not in log.read_text()
        finally:
            for server, _ in seen:
                server.stop()
        # a port the caller chose is the caller's: a clash there fails at once
        seen.clear()
        with pytest.raises(ServerError, match="Errno 98"):
            start_on_loopback(
                lambda port: [sys.executable, "-c", LONE_SERVER, str(port)],
                tmp_path / "fixed.log",
                None,
                None,
                30,
                port=busy,
                started=lambda server, port: seen.append((server, port)),
            )
        for server, _ in seen:
            server.stop()
        assert [port for _, port in seen] == [busy]
