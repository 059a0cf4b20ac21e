"""The recording scheduler's step record, read back (a real vLLM 0.32 record in the test data)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gpu_simulate_test.core.engines.step_record import FOREIGN, read_record

DATA = Path(__file__).resolve().parents[3] / "data" / "vllm" / "step_record"
TOKEN = "d4935f80"
PHASES = ["num_prefill_requests", "num_prefill_tokens", "num_decode_requests", "num_decode_tokens"]


def test_the_record_has_every_step_of_vllm_s_own_log_and_its_preemptions() -> None:
    record = read_record(DATA / "engine_steps.jsonl", TOKEN)
    log = pd.read_csv(DATA / "engine_step_log.csv")
    assert len(record.steps) == len(log) == 661
    # the same steps with the same context/generation split as vLLM's iteration log
    assert (record.steps[PHASES].to_numpy() == log[PHASES].to_numpy()).all()
    assert record.steps["num_preempted"].sum() == 10  # vllm:num_preemptions_total said 10
    assert record.unreadable_lines == 0 and record.foreign_requests == 0
    assert (record.steps["end_time_s"] > record.steps["start_time_s"]).all()
    assert (record.steps["start_time_s"].diff().dropna() > 0).all()


def test_every_request_has_exact_stamps_in_order() -> None:
    record = read_record(DATA / "engine_steps.jsonl", TOKEN)
    lengths = pd.read_csv(DATA / "workload" / "trace_lengths.csv").set_index("request_id")
    assert sorted(record.requests) == list(range(40))
    for rid, st in record.requests.items():
        assert st.queued is not None and st.scheduled is not None and st.finished is not None
        assert st.queued <= st.scheduled < st.token_times[0] <= st.finished
        assert len(st.token_times) == lengths.loc[rid, "num_decode_tokens"]
        assert st.finished == st.token_times[-1]
    assert sum(st.preemptions for st in record.requests.values()) == 10


def test_another_run_s_requests_are_told_apart(tmp_path: Path) -> None:
    lines = (DATA / "engine_steps.jsonl").read_text().splitlines()
    # a step of another run in the middle of ours, and a line cut short by a stopped server
    step = json.loads(next(x for x in lines[200:] if '"s"' in x))
    step["r"] = [["cmpl-gstffffffff-3-0-abc", 7, 1, 0, 0], *step["r"]]
    path = tmp_path / "steps.jsonl"
    path.write_text("\n".join([*lines[:200], json.dumps(step), *lines[200:], '{"s": 1.0, "r"']))
    record = read_record(path, TOKEN)
    assert record.foreign_requests == 1 and record.unreadable_lines == 1
    assert record.steps["requests"].str.contains(f"{FOREIGN}:7").sum() == 1
    assert read_record(path, "ffffffff").requests.keys() == {3}
    assert len(read_record(path, TOKEN, wanted={0, 1}).requests) == 2


@pytest.mark.parametrize("origin", [0.0, 100.0])
def test_the_table_is_on_the_run_clock(origin: float) -> None:
    record = read_record(DATA / "engine_steps.jsonl", TOKEN)
    table = record.table(0.5, origin)
    assert table["start_time_s"].iloc[0] == pytest.approx(
        record.steps["start_time_s"].iloc[0] + 0.5 - origin
    )


DP2 = DATA.parent / "step_record_dp2"


def test_a_data_parallel_record_is_read_per_engine() -> None:
    """Two engine cores (``--data-parallel-size 2``) append to one record: each line says its
    engine; each engine's steps are numbered apart, the request's engine is the one that queued
    it, and the table is what the run wrote."""
    record = read_record(DP2 / "engine_steps.jsonl", "94dbddc2")
    assert record.engines == 2
    steps = record.steps
    assert steps["engine"].value_counts().to_dict() == {0: 628, 1: 564}
    assert (steps["start_time_s"].diff().dropna() >= 0).all()  # one clock, in time order
    for _, mine in steps.groupby("engine"):
        assert list(mine["step_index"]) == list(range(len(mine)))
        assert (mine["start_time_s"].diff().dropna() > 0).all()
    engines = pd.Series({rid: st.engine for rid, st in record.requests.items()})
    assert engines.value_counts().to_dict() == {0: 31, 1: 29}
    written = pd.read_csv(DP2 / "request_metrics.csv").set_index("request_id")["engine"]
    assert (engines.sort_index() == written.sort_index()).all()
    # a request's every step ran on its engine
    for row in steps.itertuples():
        for item in str(row.requests).split():
            assert engines[int(item.split(":")[0])] == row.engine
    schedule = pd.read_csv(DP2 / "engine_schedule.csv")
    assert (schedule["engine"].to_numpy() == steps["engine"].to_numpy()).all()
    log = pd.read_csv(DP2 / "engine_step_log.csv")
    assert log["engine"].value_counts().to_dict() == {0: 628, 1: 564}
    assert read_record(DATA / "engine_steps.jsonl", TOKEN).engines == 1  # no "g": one engine
