"""Run directories: safe ids, no silent overwrite, failed runs never look complete."""

from __future__ import annotations

import errno
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from gpu_simulate_test.io import layout, runs
from gpu_simulate_test.io.artifacts import ArtifactError, read_json
from gpu_simulate_test.io.runs import RunExistsError, open_upstream_run, start_run


@pytest.mark.parametrize("bad", ["", "../x", "a/b", "a\\b", "..", ".hidden", "x" * 200, "sp ace"])
def test_bad_run_ids_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match=r"output\.run_id"):
        layout.validate_run_id(bad)


def test_complete_run_has_meta_and_no_marker(tmp_path: Path) -> None:
    with start_run(tmp_path, "workload", "r1", {"a": 1}) as run:
        assert (run.path / layout.INCOMPLETE_MARKER).exists()
        assert read_json(run.path / layout.RUN_META)["status"] == "running"
        run.update_meta(extra=5)
    meta = open_upstream_run(tmp_path / "workload" / "r1", "workload")
    assert meta["status"] == "complete" and meta["extra"] == 5 and meta["config"] == {"a": 1}
    for key in ("git", "packages", "host", "start_time", "end_time", "stage", "run_id"):
        assert key in meta
    assert not (run.path / layout.INCOMPLETE_MARKER).exists()


def test_second_run_with_same_id_never_overwrites(tmp_path: Path) -> None:
    with start_run(tmp_path, "workload", "r1", {}) as run:
        (run.path / "data.txt").write_text("first")
    with (
        pytest.raises(RunExistsError, match="already exists"),
        start_run(tmp_path, "workload", "r1", {}),
    ):
        pass
    assert (tmp_path / "workload" / "r1" / "data.txt").read_text() == "first"
    with start_run(tmp_path, "workload", "r1", {}, overwrite=True) as run:
        assert not (run.path / "data.txt").exists()


def test_failed_run_is_marked_and_refused_downstream(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), start_run(tmp_path, "workload", "bad", {}):
        raise RuntimeError("boom")
    path = tmp_path / "workload" / "bad"
    meta = read_json(path / layout.RUN_META)
    assert meta["status"] == "failed" and "boom" in meta["error"]
    assert (path / layout.INCOMPLETE_MARKER).exists()
    with pytest.raises(ArtifactError, match="not complete"):
        open_upstream_run(path, "workload")


def test_interrupted_run_is_marked_interrupted(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), start_run(tmp_path, "workload", "ctrl-c", {}):
        raise KeyboardInterrupt
    assert read_json(tmp_path / "workload" / "ctrl-c" / layout.RUN_META)["status"] == "interrupted"


def test_upstream_of_wrong_stage_or_missing(tmp_path: Path) -> None:
    with start_run(tmp_path, "workload", "w", {}):
        pass
    with pytest.raises(ArtifactError, match="is a workload run, expected a real_bench run"):
        open_upstream_run(tmp_path / "workload" / "w", "real_bench")
    with pytest.raises(ArtifactError, match="run directory does not exist"):
        open_upstream_run(tmp_path / "nope", "workload")


def test_a_signal_is_named_as_the_interruption(tmp_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt), start_run(tmp_path, "workload", "hup", {}):
        raise KeyboardInterrupt("by SIGHUP")  # as the stages' handler raises it
    meta = read_json(tmp_path / "workload" / "hup" / layout.RUN_META)
    assert meta["status"] == "interrupted" and meta["error"] == "interrupted by SIGHUP"
    with pytest.raises(KeyboardInterrupt), start_run(tmp_path, "workload", "int", {}):
        raise KeyboardInterrupt
    meta = read_json(tmp_path / "workload" / "int" / layout.RUN_META)
    assert meta["error"] == "interrupted by the user (Ctrl-C)"


def test_a_signal_during_the_final_status_is_delivered_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second Ctrl-C (a real signal, with another thread alive for the kernel to hand it to)
    while the final status is written: the status is written whole, then the signal is heard."""
    saved = signal.signal(signal.SIGINT, signal.default_int_handler) or signal.SIG_DFL
    real_write = runs.write_json
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()

    def write(path: Path, data: dict) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # time for the handler to run, were it not held
        real_write(path, data)

    try:
        with pytest.raises(KeyboardInterrupt), start_run(tmp_path, "workload", "held", {}):
            monkeypatch.setattr(runs, "write_json", write)
    finally:
        stop.set()
        restored = signal.signal(signal.SIGINT, saved)
    meta = read_json(tmp_path / "workload" / "held" / layout.RUN_META)
    assert meta["status"] == "complete"
    assert not (tmp_path / "workload" / "held" / layout.INCOMPLETE_MARKER).exists()
    assert restored is signal.default_int_handler  # the handler it had, put back


def test_a_failed_run_whose_status_cannot_be_written_keeps_its_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(path: Path, data: dict) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(RuntimeError, match="boom"), start_run(tmp_path, "workload", "full", {}):
        monkeypatch.setattr(runs, "write_json", full)
        raise RuntimeError("boom")  # the run's own error goes on, not the disk's
    path = tmp_path / "workload" / "full"
    assert (path / layout.INCOMPLETE_MARKER).exists()
    with pytest.raises(ArtifactError, match=r"not complete \(status=running\)"):
        open_upstream_run(path, "workload")


def test_an_overwrite_interrupted_while_deleting_leaves_no_complete_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with start_run(tmp_path, "workload", "r1", {}) as run:
        (run.path / "data.txt").write_text("first")

    def interrupted(path: Path) -> None:
        (Path(path) / "data.txt").unlink()  # half deleted
        raise KeyboardInterrupt

    monkeypatch.setattr(runs.shutil, "rmtree", interrupted)
    with pytest.raises(KeyboardInterrupt), start_run(tmp_path, "workload", "r1", {}, True):
        pass
    assert not (tmp_path / "workload" / "r1").exists()  # moved aside before the deletion
    [aside] = (tmp_path / "workload").iterdir()
    assert aside.name.startswith(".r1.replaced-")


def test_an_overwrite_never_deletes_its_own_input(tmp_path: Path) -> None:
    with start_run(tmp_path, "compare", "sweep", {}) as run:
        (run.path / "data.txt").write_text("first")
    inputs = [tmp_path / "compare" / "other", tmp_path / "compare" / "sweep"]
    with (
        pytest.raises(RunExistsError, match=r"holds this run's own input .*sweep"),
        start_run(tmp_path, "compare", "sweep", {}, True, inputs),
    ):
        pass
    assert (tmp_path / "compare" / "sweep" / "data.txt").read_text() == "first"
    with start_run(tmp_path, "compare", "sweep", {}, True, inputs[:1]) as run:
        assert not (run.path / "data.txt").exists()


def test_a_run_stopped_while_it_probes_the_host_leaves_no_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def stopped() -> dict:
        raise KeyboardInterrupt  # Ctrl-C while git answers

    monkeypatch.setattr(runs, "git_commit", stopped)
    with pytest.raises(KeyboardInterrupt), start_run(tmp_path, "workload", "early", {}):
        pass
    assert not (tmp_path / "workload" / "early").exists()  # the id free for the run again
