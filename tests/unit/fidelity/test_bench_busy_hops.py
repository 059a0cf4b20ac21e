"""The busy-hop benchmark's readings of a server's own files (issue 64)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from benchmarks.fidelity import bench_busy_hops as bench


def write_server(run_dir: Path) -> None:
    """Three steps of request a; b queued 0.1 ms after the first (a drain), c 1.2 ms after the
    second (a drain too: a runs on), d 2 ms after the last, with nothing left to run."""
    lines = [
        {"s": 0.000, "e": 0.008, "r": [["a-1", 16]]},
        {"q": "b-1-x", "t": 0.0081},
        {"s": 0.0090, "e": 0.017, "r": [["a-1", 1], ["b-1-x", 16]]},
        {"q": "c-2-x", "t": 0.0182},
        {"s": 0.0190, "e": 0.027, "r": [["a-1", 1], ["c-2-x", 16]]},
        {"q": "d-3-x", "t": 0.029},
        {"s": 0.0300, "e": 0.038, "r": [["d-3-x", 16]]},
    ]
    run_dir.mkdir(parents=True)
    (run_dir / "engine_steps.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_late_drains_counts_stamps_between_steps_that_share_a_request(tmp_path: Path) -> None:
    write_server(tmp_path / "run")
    out = bench.late_drains(bench.ServerLog.read(tmp_path / "run"))
    assert out["stamps"] == 3
    assert out["drains_with_work"] == 2  # d's steps share nothing: an idle engine's arrival
    assert out["after_held_back"] == 1  # c, 1.2 ms after its step's end
    assert out["after_end_p50_p90_ms"][0] == pytest.approx(0.65)


def test_clock_offset_finds_the_tables_steps_among_the_servers() -> None:
    steps = np.array([[10.0, 10.008], [10.009, 10.017], [10.019, 10.027]])
    assert bench.clock_offset(steps, np.array([0.0, 0.009])) == pytest.approx(10.0)
    with pytest.raises(ValueError, match="not among the server's recorded steps"):
        bench.clock_offset(steps, np.array([0.0, 0.004]))


def test_busy_sends_reads_the_remainders_and_the_misses() -> None:
    steps = np.array([[0.0, 0.008], [0.009, 0.017]])
    sent = np.array([0.002, 0.004, 0.0085])
    front = sent + 0.002
    queued = np.array([0.0081, 0.0171, 0.0091])  # the second missed step 0's end
    out = bench.busy_sends(sent, front, queued, steps)
    assert len(out) == 2  # the third was sent between steps
    assert out["remainder_ms"].to_numpy() == pytest.approx([6.0, 4.0])
    assert out["at_front_ms"].to_numpy() == pytest.approx([4.0, 2.0])
    assert out["missed"].tolist() == [False, True]
    assert out["to_front_ms"].to_numpy() == pytest.approx([2.0, 2.0])


def test_a_replayed_send_is_paired_only_with_a_lone_arrival(tmp_path: Path) -> None:
    """Each replayed busy send takes the calibration's one API-server arrival within 10 ms after
    it; a send with two there (another send close by) is left out, not paired by guess."""
    steps = np.array([[0.0, 0.008], [0.009, 0.017], [0.020, 0.028], [0.029, 0.037]])
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    header = "backend,rate_qps,start_time_s,client_send_offsets_ms\n"
    rows = "vllm,5.0,0.0,1.0\nvllm,40.0,0.020,1.0;1.5\n"  # one send alone, two close together
    (bundle / "serving_steps.csv").write_text(header + rows)
    meta = {"engine_calibration": {"vllm": {"serving": {"capacity_qps_estimate": 80.0}}}}
    (bundle / "meta.json").write_text(json.dumps(meta))
    front = pd.DataFrame({"engine_s": [0.003, 0.023, 0.0235], "queued": [0.0081, 0.0281, 0.0282]})
    out = bench.replay_sends(bundle, steps, front)
    assert len(out) == 1  # the two close sends each see two arrivals
    assert out["to_front_ms"].to_numpy() == pytest.approx([2.0])
    assert out["side"].tolist() == ["replays <=10%"]
    assert not out["missed"].any()
