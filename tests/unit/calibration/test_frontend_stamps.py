"""The front end from the engine's own stamps: the calibration's prompts, the hop separated from
the wait for a step in progress, a robust line, and the iteration log's reading as a check."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.calibration.experiments import Experiment
from gpu_simulate_test.calibration.frontend import (
    checked,
    frontend_from_engine_clock,
    hop_s,
    theil_sen,
)
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder


def test_theil_sen_is_not_moved_by_one_wild_reading() -> None:
    x = [0, 0, 0, 1, 1, 2, 2, 3, 3]
    y = [3.0, 59.0, 3.1, 3.5, 3.4, 4.0, 4.1, 4.5, 4.4]  # one idle reading 20x the others
    intercept, slope = theil_sen(x, y)
    assert intercept == pytest.approx(3.0, abs=0.3) and slope == pytest.approx(0.5, abs=0.1)
    a, _slope = np.polyfit(x, y, 1)[::-1]
    assert a > 10  # what least squares made of it


def test_a_request_queued_as_a_step_ended_waited_for_it() -> None:
    steps = np.array([[1.000, 1.004], [1.0041, 1.008]])
    # sent at 1.001, queued at 1.0042 just after the first step's end: it reached the engine
    # during that step, taken as the middle of [send, end]
    assert hop_s(1.001, 1.0042, steps) == pytest.approx((1.001 + 1.004) / 2 - 1.001)
    # queued on an idle engine: the stamp itself
    assert hop_s(2.0, 2.003, steps) == pytest.approx(0.003)
    assert hop_s(1.001, 1.0042, None) == pytest.approx(0.0032)


def calibration(
    hops_ms: dict[int, list[float]], output_ms: float
) -> tuple[list[Experiment], list[list[BenchRequest]], Recorder]:
    experiments, groups, requests = [], [], []
    rid = 0
    for running, hops in hops_ms.items():
        for _ in hops:
            exp = Experiment("mixed" if running else "prefill", max(running, 1), 32)
            group = [
                BenchRequest(request_id=rid + j, num_prefill_tokens=32, num_decode_tokens=4,
                             scheduled_arrival_s=0.0)
                for j in range(exp.num_requests)
            ]  # fmt: skip
            rid += exp.num_requests
            experiments.append(exp)
            groups.append(group)
            requests.extend(group)
    rec = Recorder(requests)
    t = 0.0
    for group, hop in zip(groups, [h for hops in hops_ms.values() for h in hops], strict=True):
        r = rec.records[group[-1].request_id]
        t += 1.0
        r.arrival_s = t
        r.engine_arrival_s = t + hop / 1000.0
        first = r.engine_arrival_s + 0.005
        r.engine_token_times_s = [first]
        r.event_times_s = [first + output_ms / 1000.0]
        r.event_num_tokens = [1]
    return experiments, groups, rec


def test_the_stamped_front_end_recovers_input_output_and_growth() -> None:
    hops = {0: [3.0, 3.0, 59.0, 3.0], 2: [4.0, 4.0], 4: [5.0, 5.0]}  # one late idle reading
    experiments, groups, rec = calibration(hops, 2.0)
    front = frontend_from_engine_clock(experiments, groups, rec)
    assert front is not None and front["source"] == "engine stamps"
    assert front["input_ms"] == pytest.approx(3.0, abs=0.01)
    assert front["input_per_running_ms"] == pytest.approx(0.5, abs=0.01)
    assert front["output_ms"] == pytest.approx(2.0, abs=0.01)
    assert front["samples"] == {"0": 4, "2": 2, "4": 2} and front["requests"] == 8


def test_without_stamps_there_is_no_stamped_front_end() -> None:
    experiments, groups, rec = calibration({0: [3.0, 3.0, 3.0]}, 1.0)
    for r in rec.records.values():
        r.engine_arrival_s = None
    assert frontend_from_engine_clock(experiments, groups, rec) is None


def test_the_check_says_whether_the_two_readings_agree() -> None:
    stamped = {"input_ms": 3.0, "input_per_running_ms": 0.5, "output_ms": 2.0}
    near = {"input_ms": 4.0, "input_per_running_ms": 0.0, "output_ms": 2.5}
    far = {"input_ms": 59.4, "input_per_running_ms": 0.0, "output_ms": 0.0}
    assert checked(stamped, near)["check"]["agree"] is True
    result = checked(stamped, far)["check"]
    assert result["agree"] is False and result["difference_ms"] == pytest.approx(54.4)
    assert checked(stamped, None)["check"] is None


def test_the_step_record_gives_the_calibration_the_engine_s_own_step_costs() -> None:
    from pathlib import Path
    from types import SimpleNamespace

    from gpu_simulate_test.calibration.frontend import recorded_schedule
    from gpu_simulate_test.core.engines.step_record import read_record, step_log_rows
    from gpu_simulate_test.core.engines.vllm_log import step_cost_ms

    data = Path(__file__).resolve().parents[2] / "data" / "vllm" / "step_record"
    record = read_record(data / "engine_steps.jsonl", "d4935f80")
    rec = Recorder([BenchRequest(0, 8, 2, 0.0)])
    rec.origin = float(record.steps["start_time_s"].iloc[0])
    schedule = recorded_schedule(SimpleNamespace(record=record, record_offset=0.0), rec)
    assert schedule is not None
    frame = step_log_rows(schedule, timed=True)
    assert len(frame) == 661 and frame["time_s"].iloc[0] > 0
    cost, loop = step_cost_ms(frame)
    # between back-to-back steps the engine spends well under a millisecond outside them
    assert 0 < loop < 1.0
    ends = record.steps["end_time_s"].to_numpy()
    decoding = frame["num_decode_requests"].to_numpy() > 0
    periods = np.diff(ends) * 1000.0
    assert np.allclose(cost.to_numpy()[1:][decoding[1:]], periods[decoding[1:]], rtol=1e-9)
    assert recorded_schedule(SimpleNamespace(), rec) is None


def test_an_idle_prefill_costs_the_engine_s_queue_to_first_token() -> None:
    from gpu_simulate_test.calibration.step_times import idle_prefills_from_stamps

    experiments, groups, rec = calibration({0: [3.0, 3.0], 2: [4.0]}, 1.0)
    logged = {experiments[0]: [0.004, 0.004], experiments[2]: [0.006]}
    out = idle_prefills_from_stamps(experiments, groups, rec, logged)
    assert out[experiments[0]] == pytest.approx([0.005, 0.005])  # queued to first token
    assert out[experiments[2]] == [0.006]  # a mixed step keeps its step time
    rec.records[groups[1][0].request_id].engine_arrival_s = None
    assert idle_prefills_from_stamps(experiments, groups, rec, logged) == logged


def replayed(n: int, hop_ms: float, per_running_ms: float) -> tuple[Recorder, pd.DataFrame]:
    """``n`` replayed requests, each alone (sent after the one before ended) or, every third,
    sent while the one before still runs; hop = hop_ms + per_running_ms · running."""
    rec = Recorder([BenchRequest(i, 16, 4, 0.0) for i in range(n)])
    steps = []
    t = 1.0
    for i in range(n):
        r = rec.records[i]
        running = 1 if i % 3 == 2 else 0
        r.arrival_s = t if running == 0 else t - 0.050  # while request i-1 runs
        r.engine_arrival_s = r.arrival_s + (hop_ms + per_running_ms * running) / 1000.0
        r.engine_token_times_s = [r.engine_arrival_s + 0.010, r.engine_arrival_s + 0.190]
        steps.append((r.engine_arrival_s + 0.001, r.engine_arrival_s + 0.009))
        t += 0.2
    schedule = pd.DataFrame(steps, columns=["start_time_s", "end_time_s"])
    return rec, schedule


def test_the_replays_give_the_input_line_the_judged_runs_see() -> None:
    from gpu_simulate_test.calibration.frontend import input_from_replays, with_replay_input

    rec, schedule = replayed(30, 5.0, 2.0)
    line = input_from_replays(rec, schedule, [(1.0, 0.5, 100.0)])
    assert line is not None and line["requests"] == 30
    assert line["input_ms"] == pytest.approx(5.0, abs=0.01)
    assert line["input_per_running_ms"] == pytest.approx(2.0, abs=0.01)
    assert line["samples"] == {"0": 20, "1": 10}
    # a request outside every window is not read; too few requests: no line
    assert input_from_replays(rec, schedule, [(1.0, 0.5, 2.0)]) is None
    experiments = {"input_ms": 3.7, "input_per_running_ms": 0.6, "output_ms": 2.4,
                   "measured_input_ms": {"0": 3.7}, "samples": {"0": 12}}  # fmt: skip
    front = with_replay_input(experiments, line)
    assert front["input_ms"] == 5.0 and front["output_ms"] == 2.4
    assert front["experiments_input"]["input_ms"] == 3.7
    assert front["input_source"] == "calibration replays under load"
    assert with_replay_input(experiments, None) is experiments


def test_the_replays_hand_the_busy_spread_each_requests_last_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Version 20: the busy sends' spread tells drains from arrivals by each replayed request's
    last token, in the same order as its send and queue stamps."""
    from gpu_simulate_test.calibration import busy_hop, frontend

    seen: dict[str, list[float]] = {}

    def spy(sent, queued, running, spans, line, held_back_s, running_max, done_s=None):
        seen.update(sent=list(sent), queued=list(queued), done=list(done_s))
        return {}

    monkeypatch.setattr(busy_hop, "busy_hop_spread", spy)
    rec, schedule = replayed(30, 5.0, 2.0)
    assert frontend.input_from_replays(rec, schedule, [(1.0, 0.5, 100.0)]) is not None
    records = [rec.records[i] for i in range(30)]
    assert seen["sent"] == [r.arrival_s for r in records]
    assert seen["done"] == [r.engine_last_token for r in records]


def test_a_send_to_an_idle_engine_is_read_apart_from_the_line() -> None:
    from gpu_simulate_test.calibration.frontend import input_line, with_replay_input
    from gpu_simulate_test.calibration.overhead import FrontEnd

    # this host's pattern: the idle engine's hop longer than with one to three running
    rng = np.random.default_rng(3)
    running = np.concatenate([np.zeros(40, int), rng.integers(1, 12, 200)])
    hops = np.where(running == 0, 4.0, 2.8 + 0.2 * running) + rng.normal(0, 0.05, len(running))
    line = input_line(running.tolist(), hops.tolist(), idle=True)
    assert line["input_idle_ms"] == pytest.approx(4.0, abs=0.05)
    assert line["input_idle_requests"] == 40
    assert line["input_ms"] == pytest.approx(2.8, abs=0.05)
    assert line["input_per_running_ms"] == pytest.approx(0.2, abs=0.01)
    every = line["input_all_sends"]  # one line through both: short when idle, long when busy
    assert every["input_ms"] < 3.5 and every["input_ms"] > line["input_ms"]
    assert abs(line["input_residual_ms"]["0"][len(line["input_residual_ms"]["0"]) // 2]) < 0.1
    front = FrontEnd.from_calibration(
        with_replay_input({"input_ms": 3.0, "output_ms": 1.0}, {**line, "requests": 240}), "fe"
    )
    assert front.input_delays_s(np.array([0, 1, 5])) == pytest.approx(
        [0.004, 0.003, 0.0038], abs=1e-4
    )
    # too few idle sends, or the busy ones at one load: one line, no idle reading
    few = input_line([0] * 9 + [1, 2, 3] * 10, [4.0] * 9 + [3.0] * 30, idle=True)
    assert "input_idle_ms" not in few
    flat = input_line([0] * 20 + [2] * 20, [4.0] * 20 + [3.0] * 20, idle=True)
    assert "input_idle_ms" not in flat
    assert "input_idle_ms" not in input_line(running.tolist(), hops.tolist())  # not asked
    assert FrontEnd(3.0, 1.0).input_idle_ms is None
    # the simulation passes again with the counts in flight whenever they move the way in
    assert front.moves_with_load and FrontEnd(3.0, 1.0, input_idle_ms=4.0).moves_with_load
    assert FrontEnd(3.0, 1.0, input_per_running_ms=0.2).moves_with_load
    assert not FrontEnd(3.0, 1.0).moves_with_load
