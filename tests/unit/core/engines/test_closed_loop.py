"""The real bench's closed loop for multi-turn sessions (:mod:`.closed_loop`): a later turn's
prompt is the previous prompt + the output ids it returned + the new message, and never a
wrong-length one; a turn is due its think time after the previous turn's last token; sessions
start on their own schedule; backends and pipelines that cannot run sessions refuse at once."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from gpu_simulate_test.core.engines import BACKENDS, Backend, check_serves_sessions
from gpu_simulate_test.core.engines.closed_loop import (
    NOT_SENT,
    SessionLoop,
    describe_sessions,
    next_turn,
    replay_sessions,
)
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder, RequestRecord
from gpu_simulate_test.core.traffic.requests import load_requests
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io.artifacts import ArtifactError
from tests.conftest import run_cli


def _turn(rid: int, session: int, turn: int, prefill: int, decode: int, ids: Sequence[int],
          arrival: float = math.nan, think: float = 0.0) -> BenchRequest:  # fmt: skip
    return BenchRequest(
        request_id=rid,
        num_prefill_tokens=prefill,
        num_decode_tokens=decode,
        scheduled_arrival_s=arrival if turn == 0 else math.nan,
        prompt_token_ids=tuple(ids),
        session_id=session,
        turn=turn,
        think_time_s=think,
    )


def _closed(rid: int, status: str = "ok", last_token_s: float = 1.0) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        num_prefill_tokens=0,
        expected_decode_tokens=0,
        scheduled_arrival_s=0.0,
        arrival_s=0.5,
        event_times_s=[0.8, last_token_s],
        event_num_tokens=[1, 1],
        status=status,
        error="" if status == "ok" else "HTTP 500: boom",
    )


# ------------------------------------------------------------------------- the prompt of a turn
def test_a_later_turn_sends_the_conversation_so_far_due_its_think_time_after_the_last_token() -> (
    None
):
    first = _turn(0, 3, 0, prefill=4, decode=2, ids=(1, 2, 3, 4), arrival=0.0)
    second = _turn(1, 3, 1, prefill=4 + 2 + 3, decode=5, ids=(7, 8, 9), think=0.25)
    built = next_turn(second, first, (1, 2, 3, 4), _closed(0, last_token_s=1.5), (50, 51))
    assert isinstance(built, BenchRequest)
    assert built.prompt_token_ids == (1, 2, 3, 4, 50, 51, 7, 8, 9)
    assert len(built.prompt_token_ids) == built.num_prefill_tokens
    assert built.scheduled_arrival_s == 1.75  # the last token + the think time
    assert (built.request_id, built.num_decode_tokens, built.turn) == (1, 5, 1)


@pytest.mark.parametrize(
    ("status", "output", "reason"),
    [
        ("error", (50, 51), r"session 3 turn 0 \(request 0\) ended error: HTTP 500: boom"),
        ("ok", None, "returned no output token ids"),
        ("ok", (50,), "returned 1 output token ids, not its num_decode_tokens 2"),
        ("ok", (50, 51, 52), "returned 3 output token ids, not its num_decode_tokens 2"),
    ],
)
def test_a_turn_is_not_built_on_a_failed_or_wrong_length_answer(
    status: str, output: tuple[int, ...] | None, reason: str
) -> None:
    first = _turn(0, 3, 0, prefill=4, decode=2, ids=(1, 2, 3, 4), arrival=0.0)
    second = _turn(1, 3, 1, prefill=9, decode=5, ids=(7, 8, 9), think=0.25)
    why = next_turn(second, first, (1, 2, 3, 4), _closed(0, status), output)
    assert isinstance(why, str)
    assert re.search(reason, why), why


def test_a_prompt_that_would_not_be_num_prefill_tokens_long_is_not_sent() -> None:
    first = _turn(0, 0, 0, prefill=4, decode=2, ids=(1, 2, 3, 4), arrival=0.0)
    second = _turn(1, 0, 1, prefill=10, decode=5, ids=(7, 8, 9), think=0.25)  # one too many
    why = next_turn(second, first, (1, 2, 3, 4), _closed(0), (50, 51))
    assert (
        isinstance(why, str) and "4 + 2 + 3 = 9 prompt tokens, not its num_prefill_tokens 10" in why
    )


# ------------------------------------------------------------------------- the loop's bookkeeping
def _two_sessions() -> list[BenchRequest]:
    return [
        _turn(0, 0, 0, 4, 2, (1, 2, 3, 4), arrival=0.0),
        _turn(1, 0, 1, 9, 2, (5, 6, 7), think=0.1),
        _turn(2, 0, 2, 14, 2, (8, 9, 10), think=0.1),
        _turn(3, 1, 0, 3, 2, (11, 12, 13), arrival=0.2),
        _turn(4, 1, 1, 6, 2, (14,), think=0.0),
    ]


def test_sessions_start_on_schedule_and_a_failed_turn_drops_its_sessions_later_turns() -> None:
    requests = _two_sessions()
    loop = SessionLoop(requests)
    recorder = Recorder(requests)
    recorder.track_closes(loop.following)
    assert [loop.pop().request_id, loop.pop().request_id] == [0, 3]  # the session starts
    assert loop.peek() is None  # nothing more until a stream closes
    recorder.arrived(3, 0.0)
    recorder.tokens(3, 0.3)
    recorder.tokens(3, 0.4)
    recorder.finish(3, "ok", output_token_ids=(90, 91))
    assert loop.closed(3, recorder, now_s=0.41) == []
    nxt = loop.pop()
    assert nxt.request_id == 4 and nxt.prompt_token_ids == (11, 12, 13, 90, 91, 14)
    rec = recorder.record(4)
    assert rec.scheduled_arrival_s == pytest.approx(0.4) and rec.sendable_s == 0.41
    assert not rec.sent_when_due  # think time 0: due at the last token, sendable at the close
    recorder.finish(0, "error", "HTTP 500: boom")
    lost = loop.closed(0, recorder, now_s=0.5)
    assert [rid for rid, _ in lost] == [1, 2]
    assert lost[0][1].startswith(f"{NOT_SENT}: session 0 turn 0 (request 0) ended error")
    assert "stopped at turn 1" in lost[1][1]
    assert loop.following == {}


def test_a_later_turn_without_its_turn_before_it_is_refused() -> None:
    requests = _two_sessions()
    with pytest.raises(ValueError, match="request 2 is session 0's turn 2 without its turn"):
        SessionLoop([requests[0], requests[2]])


# ------------------------------------------------------------------------- the replay, in process
class AnsweringBackend(Backend):
    """Answers each request from a thread, one token every ``itl_s``, returning its ids."""

    name: ClassVar[str] = "vllm"
    in_process: ClassVar[bool] = False
    serves_sessions: ClassVar[bool] = True
    itl_s: ClassVar[float] = 0.003

    def __init__(self, cfg: Any = None) -> None:
        super().__init__(cfg)
        self.prompts: dict[int, tuple[int, ...]] = {}

    def start(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def warmup(self, requests: Sequence[BenchRequest]) -> None:
        pass

    def submit(self, request: BenchRequest) -> None:
        self.recorder.arrived(request.request_id, time.perf_counter())
        self.prompts[request.request_id] = request.prompt_token_ids or ()
        threading.Thread(target=self._answer, args=(request,), daemon=True).start()

    def _answer(self, request: BenchRequest) -> None:
        ids = [100 + request.request_id * 10 + i for i in range(request.num_decode_tokens)]
        for _ in ids:
            time.sleep(self.itl_s)
            self.recorder.tokens(request.request_id, time.perf_counter())
        self.recorder.finish(request.request_id, "ok", output_token_ids=ids)

    def failure(self) -> str | None:
        return None

    def close(self, abort: bool = False) -> None:
        pass


def _sessions(count: int, turns: int, gap_s: float, think_s: float) -> list[BenchRequest]:
    out: list[BenchRequest] = []
    for s in range(count):
        prefill = 6
        for t in range(turns):
            ids = tuple(range(10 * s, 10 * s + 6)) if t == 0 else (7, 7)
            prefill = prefill if t == 0 else prefill + 3 + 2
            out.append(_turn(len(out), s, t, prefill, 3, ids, arrival=s * gap_s, think=think_s))
    return out


@pytest.mark.timing
def test_replay_sessions_sends_each_turn_its_think_time_after_the_last_token() -> None:
    requests = _sessions(count=3, turns=3, gap_s=0.02, think_s=0.05)
    recorder = Recorder(requests)
    backend = AnsweringBackend()
    backend.start(recorder)
    outcome = replay_sessions(backend, requests, recorder, request_timeout_s=5)
    assert outcome.num_sent == 9
    records = {r.request_id: r for r in recorder.snapshot()}
    assert all(r.status == "ok" for r in records.values())
    for req in requests:
        rec = records[req.request_id]
        assert rec.arrival_s is not None
        sent = backend.prompts[req.request_id]
        assert len(sent) == req.num_prefill_tokens
        if req.turn == 0:
            assert 0 <= rec.arrival_s - req.scheduled_arrival_s < 0.01  # on time, open loop
            continue
        before = records[req.request_id - 1]
        answered = tuple(100 + before.request_id * 10 + i for i in range(3))
        assert sent == (*backend.prompts[before.request_id], *answered, 7, 7)
        assert rec.scheduled_arrival_s == pytest.approx(before.event_times_s[-1] + 0.05)
        assert rec.sendable_s is not None and rec.arrival_s >= rec.scheduled_arrival_s
        # sent when due, or at once when its prompt was ready only later (a loaded box)
        assert rec.arrival_s - max(rec.sendable_s, rec.scheduled_arrival_s) < 0.01
    meta = describe_sessions(requests, list(records.values()))
    assert meta["loop"] == "closed" and meta["num_sessions"] == 3 and meta["num_turns"] == 9
    assert meta["sessions_completed"] == 3 and meta["turns_not_sent"] == 0
    assert meta["later_turns_sent"] == 6
    late = sum(r.sendable_s > r.scheduled_arrival_s for r in records.values() if r.sendable_s)
    assert meta["due_before_sendable"] == late


# ------------------------------------------------------------------------- workloads and refusals
@pytest.fixture(scope="module")
def multi_turn(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mt")
    run_cli(
        "workload",
        "workload=multi_turn",
        "workload.num_requests=4",
        "output.run_id=w",
        "progress=false",
        cwd=root,
    )
    return root / "tmp" / "workload" / "w"


def test_load_requests_gives_sessions_only_to_a_caller_that_runs_them(multi_turn: Path) -> None:
    workload = load_workload(multi_turn)
    with pytest.raises(ArtifactError, match=r"a multi-turn workload \(4 sessions\)"):
        load_requests(workload)
    requests = load_requests(workload, sessions=True)
    sessions = workload.sessions
    assert sessions is not None and len(requests) == len(sessions.turn)
    for req, sid, turn, think, user in zip(
        requests,
        sessions.session_id,
        sessions.turn,
        sessions.think_time_s,
        sessions.user_tokens,
        strict=True,
    ):
        assert (req.session_id, req.turn, req.think_time_s) == (sid, turn, think)
        assert req.closed_loop == (turn > 0)
        assert np.isnan(req.scheduled_arrival_s) == (turn > 0)
        own = req.num_prefill_tokens if turn == 0 else user
        assert req.prompt_token_ids is not None and len(req.prompt_token_ids) == own


@pytest.mark.parametrize("name", ["hf_cb", "hf_generate", "vllm_engine", "openai"])
def test_a_backend_without_sessions_refuses_a_multi_turn_workload_in_one_line(
    name: str, multi_turn: Path, tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match=f"backend.name={name} cannot run a multi-turn workload"):
        check_serves_sessions(BACKENDS[name], 4)
    proc = run_cli(
        "real_bench", f"workload_dir={multi_turn}", f"backend={name}", cwd=tmp_path, check=False
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.startswith("error:") and proc.stdout.strip().count("\n") == 0
    assert f"backend.name={name} cannot run a multi-turn workload (4 sessions)" in proc.stdout
    assert "backend=vllm runs sessions" in proc.stdout
    assert not (tmp_path / "tmp" / "real_bench").exists()


def test_only_the_vllm_server_backend_runs_sessions() -> None:
    assert {n for n, cls in BACKENDS.items() if cls.serves_sessions} == {"vllm"}


def test_the_pipeline_refuses_sessions_its_backend_cannot_run_before_any_stage(
    tmp_path: Path,
) -> None:
    proc = run_cli(
        "pipeline", "workload=multi_turn", "backend=hf_cb", "output.run_id=p", cwd=tmp_path,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout.startswith("error:") and proc.stdout.strip().count("\n") == 0
    assert "backend.name=hf_cb cannot run a multi-turn workload (40 sessions)" in proc.stdout
    assert not (tmp_path / "tmp").exists()  # not even the workload


def test_the_pipeline_reads_a_traces_sessions_before_refusing_its_backend(
    multi_turn: Path, tmp_path: Path
) -> None:
    workload = load_workload(multi_turn)
    trace = workload.lengths.drop(columns=["request_id", "prefix_id", "prefix_len"])
    trace.insert(0, "arrived_at", workload.intervals["arrival_time_s"])
    trace.to_csv(tmp_path / "sessions.csv", index=False)
    proc = run_cli(
        "pipeline",
        "workload=trace",
        "workload.trace_file=sessions.csv",
        "backend=hf_generate",
        "output.run_id=p",
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "backend.name=hf_generate cannot run a multi-turn workload (4 sessions)" in proc.stdout
    assert not (tmp_path / "tmp").exists()
