"""The real_bench stage end to end on CPU, run as a user runs it (``python -m ...real_bench``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv, read_json
from gpu_simulate_test.io.schemas import REQUEST_METRICS, TOKEN_METRICS
from gpu_simulate_test.real_bench.metrics import is_monotonic
from tests.conftest import run_cli

pytestmark = pytest.mark.integration

NUM_REQUESTS = 50


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 50-request workload with short prompts and outputs arriving at 40 req/s."""
    cwd = tmp_path_factory.mktemp("real_bench")
    run_cli(
        "workload",
        "output.run_id=w50",
        f"workload.num_requests={NUM_REQUESTS}",
        "workload.qps=40",
        "workload.prompt_len.kind=uniform",
        "workload.prompt_len.min=4",
        "workload.prompt_len.max=48",
        "workload.output_len.kind=uniform",
        "workload.output_len.min=1",
        "workload.output_len.max=8",
        "progress=false",
        cwd=cwd,
    )
    return cwd


def check_run(run: Path, backend: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What a user checks: every request exact, token rows complete, times monotonic."""
    meta = read_json(run / layout.RUN_META)
    assert meta["status"] == "complete" and not (run / layout.INCOMPLETE_MARKER).exists()
    assert meta["backend"]["name"] == backend and meta["backend"]["device"] == "cpu"
    assert meta["backend"]["attn_implementation"] == "sdpa"
    assert meta["packages"]["transformers"]
    workload = load_workload(run.parent.parent / "workload" / "w50")
    requests = read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)
    tokens = read_csv(run / layout.TOKEN_METRICS, TOKEN_METRICS)
    assert len(requests) == NUM_REQUESTS and (requests.status == "ok").all()
    merged = requests.merge(workload.lengths, on="request_id", suffixes=("", "_wl"))
    assert (merged.num_prefill_tokens == merged.num_prefill_tokens_wl).all()
    assert (merged.num_decode_tokens == merged.num_decode_tokens_wl).all()
    assert len(tokens) == requests.num_decode_tokens.sum()
    for rid, group in tokens.groupby("request_id"):
        assert group.token_index.tolist() == list(range(len(group))), rid
        assert is_monotonic(group.time_s.tolist()), rid
    scheduled = workload.intervals.set_index("request_id").arrival_time_s
    error = requests.set_index("request_id").arrival_time_s - scheduled
    assert (error >= 0).all() and error.max() < 0.05  # target < 1 ms; loose on a shared box
    assert (requests.ttft_s > 0).all() and (requests.e2e_s >= requests.ttft_s).all()
    one_token = requests.num_decode_tokens == 1
    assert requests.loc[one_token, "tpot_s"].isna().all()
    assert requests.loc[~one_token, "tpot_s"].notna().all()
    summary = read_json(run / "summary.json")
    assert summary["completed"] == NUM_REQUESTS and summary["backend"] == backend
    assert summary["total_output_tokens"] == requests.num_decode_tokens.sum()
    return requests, tokens


@pytest.mark.slow  # a real engine replays the workload
def test_hf_cb_replays_the_workload_exactly(workspace: Path) -> None:
    proc = run_cli("real_bench", "workload_dir=tmp/workload/w50", "output.run_id=cb", cwd=workspace)
    assert "TTFT" in proc.stdout and "tmp/real_bench/cb" in proc.stdout
    run = workspace / "tmp" / "real_bench" / "cb"
    requests, tokens = check_run(run, "hf_cb")
    meta = read_json(run / layout.RUN_META)
    assert meta["backend"]["resolved"]["max_batch_tokens"] == 256
    assert meta["backend"]["resolved"]["allow_block_sharing"] is False
    # the engine's own stamps come along, and the harness sees each token after the engine
    assert {"engine_time_s", "engine_itl_s"} <= set(tokens.columns)
    engine_time_s = tokens.engine_time_s.astype(float)  # extra columns are read as text
    assert (tokens.time_s >= engine_time_s).all()
    assert requests.engine_ttft_s.astype(float).notna().all()


@pytest.mark.slow  # a real engine replays the workload
def test_hf_generate_replays_the_workload_exactly(workspace: Path) -> None:
    run_cli(
        "real_bench",
        "workload_dir=tmp/workload/w50",
        "backend=hf_generate",
        "output.run_id=gen",
        "progress=false",
        cwd=workspace,
    )
    check_run(workspace / "tmp" / "real_bench" / "gen", "hf_generate")


def test_missing_workload_dir_exits_2_naming_it(workspace: Path) -> None:
    proc = run_cli(
        "real_bench",
        "workload_dir=tmp/workload/nope",
        "output.run_id=x",
        cwd=workspace,
        check=False,
    )
    assert proc.returncode == 2
    assert "tmp/workload/nope" in proc.stdout and "does not exist" in proc.stdout
    assert not (workspace / "tmp" / "real_bench" / "x").exists()


def test_request_longer_than_the_context_fails_before_the_clock(workspace: Path) -> None:
    proc = run_cli(
        "real_bench",
        "workload_dir=tmp/workload/w50",
        "model.max_position_embeddings=16",
        "output.run_id=ctx",
        cwd=workspace,
        check=False,
    )
    assert proc.returncode == 2
    assert "context of 16 tokens" in proc.stdout and "request " in proc.stdout
    assert not (workspace / "tmp" / "real_bench" / "ctx").exists()


@pytest.mark.slow
def test_qwen3_0_6b_shape_in_bf16_on_cpu(tmp_path: Path) -> None:
    """The real 0.6B shape (random weights) in bf16 serves a couple of tiny requests exactly."""
    run_cli(
        "workload",
        "model=qwen3_0_6b",
        "output.run_id=w2",
        "workload.num_requests=2",
        "workload.qps=100",
        "workload.prompt_len.kind=fixed",
        "workload.prompt_len.value=8",
        "workload.output_len.kind=fixed",
        "workload.output_len.value=3",
        "workload.output_len.min=1",
        "progress=false",
        cwd=tmp_path,
    )
    run_cli(
        "real_bench",
        "model=qwen3_0_6b",
        "dtype=bfloat16",
        "workload_dir=tmp/workload/w2",
        "num_warmup_requests=1",
        "output.run_id=b",
        "progress=false",
        cwd=tmp_path,
    )
    run = tmp_path / "tmp" / "real_bench" / "b"
    meta = read_json(run / layout.RUN_META)
    assert meta["status"] == "complete" and meta["backend"]["dtype"] == "torch.bfloat16"
    requests = read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)
    assert (requests.status == "ok").all() and (requests.num_decode_tokens == 3).all()
    assert len(read_csv(run / layout.TOKEN_METRICS, TOKEN_METRICS)) == 6


def _serve_available() -> bool:
    try:
        from transformers.utils.import_utils import is_serve_available
    except ImportError:
        return False
    return bool(is_serve_available())


def test_openai_backend_fails_clearly_on_an_unreachable_endpoint(workspace: Path) -> None:
    from gpu_simulate_test.core.engines.server import free_loopback_port

    url = f"http://127.0.0.1:{free_loopback_port()}"
    proc = run_cli(
        "real_bench",
        "workload_dir=tmp/workload/w50",
        "backend=openai",
        f"backend.base_url={url}",
        "output.run_id=unreachable",
        cwd=workspace,
        check=False,
    )
    assert proc.returncode == 2 and "endpoint unreachable" in proc.stdout and url in proc.stdout
    assert not (workspace / "tmp" / "real_bench" / "unreachable").exists()


@pytest.mark.slow  # a real engine replays the workload
@pytest.mark.skipif(not _serve_available(), reason="needs transformers[serving] (fastapi, openai)")
def test_openai_backend_against_a_started_transformers_serve(tmp_path: Path) -> None:
    """A real ``transformers serve`` on a free loopback port, started and killed by the stage."""
    import contextlib
    import os
    import signal

    from omegaconf import OmegaConf

    from gpu_simulate_test.config.registry import CONFIG_DIR, to_typed
    from gpu_simulate_test.config.schema import ModelConfig
    from gpu_simulate_test.core.model.modeling import build_model
    from gpu_simulate_test.core.traffic.prompts import load_tokenizer

    model_dir = tmp_path / "qwen3_tiny"
    tiny = to_typed(OmegaConf.load(CONFIG_DIR / "model" / "qwen3_tiny.yaml"), ModelConfig)  # type: ignore[arg-type]
    build_model(tiny, "cpu", "float32").save_pretrained(model_dir)
    load_tokenizer(None).save_pretrained(model_dir)
    run_cli(
        "workload",
        "output.run_id=wt",
        "workload.num_requests=8",
        "workload.qps=20",
        "workload.prompt_mode=text",
        "workload.prompt_len.min=8",
        "workload.prompt_len.max=24",
        "workload.output_len.min=2",
        "workload.output_len.max=6",
        "progress=false",
        cwd=tmp_path,
    )
    try:
        run_cli(
            "real_bench",
            "workload_dir=tmp/workload/wt",
            "backend=openai",
            "backend.server.kind=transformers_serve",
            "backend.server.startup_timeout_s=120",
            "backend.request_timeout_s=60",
            f"model.local_path={model_dir}",
            "output.run_id=oa",
            "progress=false",
            cwd=tmp_path,
        )
    finally:  # never leave a server behind, even if the stage was killed
        meta_path = tmp_path / "tmp" / "real_bench" / "oa" / layout.RUN_META
        pid = (
            read_json(meta_path).get("backend", {}).get("server_pid")
            if meta_path.exists()
            else None
        )
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    run = tmp_path / "tmp" / "real_bench" / "oa"
    meta = read_json(run / layout.RUN_META)
    assert meta["status"] == "complete"
    assert meta["backend"]["exact_length"] == "generation_config"
    assert meta["backend"]["base_url"].startswith("http://127.0.0.1:")
    with pytest.raises(ProcessLookupError):  # the stage stopped its server
        os.kill(meta["backend"]["server_pid"], 0)
    requests = read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)
    lengths = load_workload(tmp_path / "tmp" / "workload" / "wt").lengths
    assert (requests.status == "ok").all() and len(requests) == 8
    assert requests.num_decode_tokens.tolist() == lengths.num_decode_tokens.tolist()
    tokens = read_csv(run / layout.TOKEN_METRICS, TOKEN_METRICS)
    for _, group in tokens.groupby("request_id"):
        assert is_monotonic(group.time_s.tolist())
    assert len(tokens) == requests.num_events.astype(int).sum()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal needs a machine without CUDA")
def test_a_gpu_hardware_without_cuda_fails_before_the_run_dir(workspace: Path) -> None:
    proc = run_cli(
        "real_bench",
        "workload_dir=tmp/workload/w50",
        "hardware=h100",
        "output.run_id=nogpu",
        cwd=workspace,
        check=False,
    )
    assert proc.returncode == 2
    assert "hardware=h100 needs a CUDA device" in proc.stdout
    assert not (workspace / "tmp" / "real_bench" / "nogpu").exists()


def test_a_bad_local_path_fails_before_an_earlier_run_is_replaced(workspace: Path) -> None:
    earlier = workspace / "tmp" / "real_bench" / "keep"
    earlier.mkdir(parents=True)
    (earlier / "sentinel.txt").write_text("an earlier run", encoding="utf-8")
    proc = run_cli(
        "real_bench",
        "workload_dir=tmp/workload/w50",
        f"model.local_path={workspace / 'no-snapshot'}",
        "output.run_id=keep",
        "output.overwrite=true",
        cwd=workspace,
        check=False,
    )
    assert proc.returncode == 2
    assert "no-snapshot: no config.json there" in proc.stdout
    assert (earlier / "sentinel.txt").read_text(encoding="utf-8") == "an earlier run"


@pytest.mark.parametrize(
    ("token", "shown"), [(1.5, "got 1.5"), ("7", "got '7'"), (-1, "got -1"), (True, "got True")]
)
def test_a_prompt_token_id_that_is_no_integer_is_named(
    workspace: Path, token: object, shown: str
) -> None:
    source = workspace / "tmp" / "workload" / "w50"
    bad = workspace / "tmp" / "workload" / f"w50-bad-{len(shown)}-{type(token).__name__}"
    shutil.copytree(source, bad)
    lines = (bad / layout.PROMPTS).read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    first["prompt_token_ids"][2] = token
    lines[0] = json.dumps(first)
    (bad / layout.PROMPTS).write_text("\n".join(lines) + "\n", encoding="utf-8")
    proc = run_cli(
        "real_bench", f"workload_dir={bad}", "output.run_id=badtok", cwd=workspace, check=False
    )
    assert proc.returncode == 2, proc.stdout
    assert layout.PROMPTS in proc.stdout and "prompt_token_ids[2]" in proc.stdout
    assert shown in proc.stdout
    assert not (workspace / "tmp" / "real_bench" / "badtok").exists()


@pytest.mark.slow  # a real engine replays the workload
@pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["ctrl-c", "sigterm", "sighup"]
)
def test_ctrl_c_keeps_what_was_measured_and_says_so_in_one_line(
    workspace: Path, signum: int
) -> None:
    """SIGINT, SIGTERM or SIGHUP (the terminal closed) mid-replay: exit 130, no traceback, the
    run marked interrupted, by which signal, with its tables."""
    run_cli(
        "workload",
        f"output.run_id=slow{int(signum)}",
        "workload.num_requests=200",
        "workload.qps=2",
        "workload.prompt_len.min=4",
        "workload.prompt_len.max=8",
        "workload.output_len.min=1",
        "workload.output_len.max=2",
        "progress=false",
        cwd=workspace,
    )
    run = workspace / "tmp" / "real_bench" / f"ctrlc{int(signum)}"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "120"}
    cmd = [sys.executable, "-m", "gpu_simulate_test.cli.real_bench"]
    args = [
        f"workload_dir=tmp/workload/slow{int(signum)}",
        f"output.run_id=ctrlc{int(signum)}",
        "progress=false",
    ]
    with subprocess.Popen(
        [*cmd, *args],
        cwd=workspace,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        # as from a terminal: a test session started in the background inherits SIGINT ignored,
        # and Python then never turns it into KeyboardInterrupt
        preexec_fn=_sigint_default,
    ) as proc:
        deadline = time.monotonic() + 120
        while "backend" not in _meta_or_empty(run) and time.monotonic() < deadline:
            time.sleep(0.2)  # the backend is described once warm-up is over: replay has begun
        time.sleep(2.0)
        proc.send_signal(signum)
        out, _ = proc.communicate(timeout=60)
    text = out.decode()
    assert proc.returncode == 130, text
    assert "Traceback" not in text and "interrupted (Ctrl-C, SIGTERM or SIGHUP)" in text
    meta = read_json(run / layout.RUN_META)
    how = "the user (Ctrl-C)" if signum == signal.SIGINT else signal.Signals(signum).name
    assert meta["status"] == "interrupted" and meta["error"] == f"interrupted by {how}"
    requests = read_csv(run / layout.REQUEST_METRICS, REQUEST_METRICS)
    assert (requests.status == "ok").sum() >= 1 and len(requests) < 200


def _sigint_default() -> None:
    """As from a terminal: SIGINT and SIGHUP at their defaults (a test session under nohup or
    started in the background inherits them ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def _meta_or_empty(run: Path) -> dict[str, object]:
    try:
        return dict(read_json(run / layout.RUN_META))
    except Exception:  # not written yet, or being replaced
        return {}
