"""``bench_intake_catch``'s busy sends: whether each caught its step's end and, for one that
missed, its wait taken apart (the step under way, the step after it, the stamp after the end
that took it in), read the same way off a real run and a simulation."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from benchmarks.fidelity.bench_intake_catch import busy_sends, miss_parts

STEPS_S = ((0.000, 0.010), (0.010, 0.022), (0.022, 0.030))
"""Three steps back to back: 10, 12 and 8 ms."""


def write_run(run: Path, sent: list[float], queued: list[float], sim: bool) -> Path:
    run.mkdir()
    pd.DataFrame(
        {"start_time_s": [a for a, _ in STEPS_S], "end_time_s": [b for _, b in STEPS_S]}
    ).to_csv(run / "engine_schedule.csv", index=False)
    table = {"request_id": range(len(sent)), "status": "ok", "arrival_time_s": sent}
    if sim:  # the simulation's way in: its hop, then the wait for the step under way
        hops = [min(q - s, 0.004) for s, q in zip(sent, queued, strict=True)]
        table["frontend_input_s"] = hops
        table["held_back_s"] = [q - s - h for s, q, h in zip(sent, queued, hops, strict=True)]
    else:
        table["engine_arrival_time_s"] = queued
    pd.DataFrame(table).to_csv(run / "request_metrics.csv", index=False)
    return run


@pytest.mark.parametrize("sim", [False, True])
def test_a_missed_send_waits_the_step_after_and_its_parts_are_read(
    tmp_path: Path, sim: bool
) -> None:
    # sent at 2 ms, queued at the first end (caught); sent at 7 ms, queued 0.2 ms after the
    # second end (missed: the step under way ended 3 ms after it); sent at 31 ms: no step ran
    stamp = 0.0 if sim else 0.0002
    sent = [0.002, 0.007, 0.031]
    queued = [0.010 + stamp, 0.022 + stamp, 0.0335]
    out = busy_sends(write_run(tmp_path / "run", sent, queued, sim), sim=sim)
    assert len(out) == 2  # the send to an idle engine is not a busy send
    caught, missed = out.iloc[0], out.iloc[1]
    assert bool(caught["caught"]) and not bool(missed["caught"])
    assert missed["end_ms"] == pytest.approx(3.0)
    assert missed["step_ms"] == pytest.approx(10.0)
    assert missed["next_ms"] == pytest.approx(12.0)
    assert missed["stamp_ms"] == pytest.approx(stamp * 1e3, abs=1e-6)
    assert missed["ends_waited"] == 2
    assert missed["way_in_ms"] == pytest.approx(15.0 + stamp * 1e3)
    assert caught["ends_waited"] == 1 and caught["next_ms"] == pytest.approx(12.0)


def test_the_misses_are_taken_apart_over_those_queued_at_the_next_steps_end(
    tmp_path: Path,
) -> None:
    # caught in the 12 ms step; missed the 10 ms step and queued 0.2 ms after the next end;
    # missed and queued while the step after ran (counted apart, left out of the parts)
    sent = [0.012, 0.007, 0.008]
    queued = [0.0222, 0.0222, 0.015]
    table = busy_sends(write_run(tmp_path / "run", sent, queued, sim=False), sim=False)
    parts = miss_parts(table)
    assert (parts["sends"], parts["missed"]) == (3, 2)
    assert (parts["at_next_end"], parts["otherwise"]) == (1, 1)
    assert parts["way_in_ms"] == pytest.approx(15.2)
    assert parts["end_ms"] == pytest.approx(3.0)
    assert parts["next_ms"] == pytest.approx(12.0)
    assert parts["stamp_ms"] == pytest.approx(0.2)
    assert parts["step_ms"] == pytest.approx(10.0)
    assert parts["caught_step_ms"] == pytest.approx(12.0)
    late = busy_sends(write_run(tmp_path / "late", [0.007], [0.0245], sim=False), sim=False)
    assert miss_parts(late)["at_next_end"] == 0  # 2.5 ms after the next end: not at it
