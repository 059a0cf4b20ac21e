"""The step record writes nothing between two steps: a request's queued line goes out with the
line of the step that ends next, in the same ``os.write`` (vllm_recording_scheduler's doc: a
write between steps held the next one back by about a millisecond)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm.v1.core.sched.scheduler")

from vllm.v1.core.sched.scheduler import Scheduler

from gpu_simulate_test.core.engines import vllm_recording_scheduler as rec
from gpu_simulate_test.core.engines.step_record import read_record


class Request:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id


def recorder(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, list[bytes]]:
    """A RecordingScheduler over ``path`` with vLLM's own methods as no-ops, and its writes."""
    monkeypatch.setattr(Scheduler, "add_request", lambda self, request: None)
    monkeypatch.setattr(Scheduler, "update_from_output", lambda self, out, runner: {})
    writes: list[bytes] = []

    def write(fd: int, data: bytes) -> int:
        writes.append(data)
        with path.open("ab") as f:
            return f.write(data)

    monkeypatch.setattr(rec, "os", SimpleNamespace(write=write))
    sched = object.__new__(rec.RecordingScheduler)
    sched._gst_fd, sched._gst_engine = 3, 1
    sched._gst_step, sched._gst_preempted, sched._gst_queued = None, [], []
    return sched, writes


def test_a_queued_line_waits_for_the_next_steps_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "engine_steps.jsonl"
    sched, writes = recorder(path, monkeypatch)
    sched.add_request(Request("cmpl-gstab-7"))
    sched.add_request(Request("cmpl-gstab-8"))
    assert writes == []  # nothing between the steps
    sched.update_from_output(None, None)  # a step that scheduled nothing: still held
    assert writes == []
    sched._gst_step = {"s": 1.0, "r": [["cmpl-gstab-7", 20, 1]], "p": [], "w": 1, "n": 1}
    sched.update_from_output(None, None)
    assert len(writes) == 1  # the queued lines and the step's, one write
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert [sorted(x) for x in lines] == [["g", "q", "t"], ["g", "q", "t"], sorted(
        ["s", "r", "p", "w", "n", "e", "g"])]  # fmt: skip
    assert [x.get("q") for x in lines[:2]] == ["cmpl-gstab-7", "cmpl-gstab-8"]
    assert {x["g"] for x in lines} == {1}  # every line says its engine
    assert lines[0]["t"] <= lines[1]["t"] <= lines[2]["e"]
    sched._gst_step = {"s": 2.0, "r": [["cmpl-gstab-7", 1, 0]], "p": [], "w": 0, "n": 2}
    sched.update_from_output(None, None)
    assert len(writes) == 2 and b'"q"' not in writes[1]  # each queued line once
    record = read_record(path, "ab")  # as a run reads it: both stamps, both steps, all whole
    assert record.unreadable_lines == 0 and len(record.steps) == 2
    assert record.requests[7].queued == lines[0]["t"] and record.requests[8].queued is not None
