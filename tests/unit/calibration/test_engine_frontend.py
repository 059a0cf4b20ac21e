"""Engine calibration from an engine's own step log, and the front end's latency around it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.calibration.experiments import Experiment
from gpu_simulate_test.calibration.frontend import frontend_latency
from gpu_simulate_test.calibration.overhead import FrontEnd
from gpu_simulate_test.calibration.step_times import step_log_samples
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder
from gpu_simulate_test.vidur_simulate import metrics as vidur_metrics
from gpu_simulate_test.vidur_simulate.inputs import running_at_send

LOOP_MS = 2.0
INPUT_MS = 5.0


def step(t_ms: float, elapsed_ms: float, prompt: int = 0, decodes: int = 0) -> dict[str, Any]:
    return {
        "step_index": 0,
        "time_s": t_ms / 1000.0,
        "num_prefill_requests": int(prompt > 0),
        "num_prefill_tokens": prompt,
        "num_decode_requests": decodes,
        "num_decode_tokens": decodes,
        "elapsed_ms": elapsed_ms,
        "kv_cache_usage_pct": None,
    }


def scenario() -> tuple[
    list[Experiment], list[list[BenchRequest]], Recorder, list[float], pd.DataFrame
]:
    """An idle prefill of 32 tokens sent at 0 ms, then 2 decoders (sent at 100 ms) decoding in
    lockstep, joined by a newcomer of 16 tokens sent at 150 ms."""
    exps = [Experiment("prefill", 1, 32), Experiment("mixed", 2, 16, 8)]
    groups = [
        [BenchRequest(0, 32, 4, 0.0)],
        [BenchRequest(1, 8, 8, 0.0), BenchRequest(2, 8, 8, 0.0), BenchRequest(3, 16, 4, 0.0)],
    ]
    rec = Recorder([r for g in groups for r in g])
    # idle prefill: reaches the engine at 5 ms, its 10 ms step is logged at 15 ms, the client
    # sees its first token at 15 + LOOP_MS + 1 ms
    rec.arrived(0, 0.0)
    rec.tokens(0, 0.018)
    rows = [step(15.0, 10.0, prompt=32)]
    rows += [step(15.0 + 10.0 * k, 10.0 - LOOP_MS, decodes=1) for k in (1, 2)]
    # the decoders: prefilled at 110, then decode steps every 12 ms (10 + the loop)
    rows.append(step(110.0, 8.0, prompt=16))
    t = 110.0
    for _ in range(4):
        t += 10.0 + LOOP_MS
        rows.append(step(t, 10.0, decodes=2))
    # the newcomer, sent at 150: the step logged at 158 started at 148 (it missed it); the next
    # one starts at 160 and carries it
    rec.arrived(3, 0.150)
    rows.append(step(172.0, 12.0, prompt=16, decodes=2))
    rec.tokens(3, 0.173)
    steps = pd.DataFrame(rows)
    return exps, groups, rec, [0.0, 0.1], steps


def test_step_log_samples_pick_each_experiments_steps_at_full_cost() -> None:
    exps, _groups, _rec, starts, steps = scenario()
    samples = step_log_samples(exps, starts, steps)
    # idle prefill: its own 10 ms plus the engine loop's median (the decode periods less their
    # own time: 2 ms); the mixed step follows a decode step back to back: its period, 14 ms
    assert samples[exps[0]] == pytest.approx([0.012])
    assert samples[exps[1]] == pytest.approx([0.014])


def test_step_log_samples_time_decode_batches_by_their_period() -> None:
    steps = pd.DataFrame(
        [step(100.0, 30.0, prompt=64)]
        + [step(100.0 + 12.0 * k, 9.0 + k % 2, decodes=3) for k in range(1, 6)]
        + [step(400.0, 9.0, decodes=2)]  # another experiment's window
    )
    exp = Experiment("decode", 3, 64)
    samples = step_log_samples([exp, Experiment("decode", 2, 64)], [0.09, 0.3], steps)
    assert samples[exp] == pytest.approx([0.012] * 5)


def test_frontend_latency_splits_input_from_output_and_grows_with_running() -> None:
    exps, groups, rec, starts, steps = scenario()
    front = frontend_latency(exps, groups, rec, starts, steps)
    assert front is not None
    # idle: sent at 0, step started at 5: input 5; TTFT 18 less the step's full cost (12): 6
    assert front["measured_input_ms"]["0"] == pytest.approx(INPUT_MS)
    # the newcomer reached the engine between the previous step's start (148; not before its
    # send at 150) and its own step's start (160): the middle, 155, is 5 ms after its send
    assert front["measured_input_ms"]["2"] == pytest.approx(5.0)
    assert front["input_ms"] == pytest.approx(INPUT_MS)
    assert front["input_per_running_ms"] == pytest.approx(0.0, abs=1e-9)
    assert front["output_ms"] == pytest.approx(1.0)
    assert front["engine_loop_ms"] == pytest.approx(LOOP_MS)


def test_frontend_latency_needs_an_idle_prefill() -> None:
    exps, groups, rec, starts, steps = scenario()
    assert frontend_latency(exps[1:], groups[1:], rec, starts[1:], steps) is None


def test_frontend_from_calibration_names_the_bad_field() -> None:
    where = "meta.json: engine_calibration.vllm.frontend"
    ok = FrontEnd.from_calibration({"input_ms": 5, "output_ms": 1.5}, where)
    assert ok == FrontEnd(5.0, 1.5, 0.0)
    with pytest.raises(ValueError, match=r"frontend\.output_ms: expected a finite value >= 0"):
        FrontEnd.from_calibration({"input_ms": 5, "output_ms": -1}, where)
    with pytest.raises(ValueError, match=r"frontend\.input_ms: expected a number"):
        FrontEnd.from_calibration({"input_ms": "x", "output_ms": 1}, where)
    with pytest.raises(ValueError, match="input_per_running_ms: expected a finite value"):
        FrontEnd.from_calibration(
            {"input_ms": 1, "output_ms": 1, "input_per_running_ms": float("nan")}, where
        )


def test_the_quiet_clients_input_is_read_beside_the_replays_line() -> None:
    where = "meta.json: engine_calibration.vllm.frontend"
    recorded = {"input_ms": 8.2, "output_ms": 3.0, "experiments_input": {"input_ms": 3.58}}
    assert FrontEnd.from_calibration(recorded, where).quiet_input_ms == 3.58
    assert FrontEnd.from_calibration({"input_ms": 5, "output_ms": 1}, where).quiet_input_ms is None
    with pytest.raises(ValueError, match=r"experiments_input\.input_ms: expected a finite"):
        FrontEnd.from_calibration({**recorded, "experiments_input": {"input_ms": -1}}, where)


def test_input_delay_grows_with_running_requests() -> None:
    front = FrontEnd(input_ms=4.0, output_ms=1.0, input_per_running_ms=2.0)
    assert front.input_delays_s(np.array([0, 1, 3])) == pytest.approx([0.004, 0.006, 0.010])


def test_input_delay_stops_growing_past_the_calibrated_running_counts() -> None:
    where = "meta.json: engine_calibration.vllm.frontend"
    recorded = {  # a real calibration's (the fidelity campaign of 2026-11-26)
        "input_ms": 3.8739,
        "input_per_running_ms": 1.1259,
        "output_ms": 2.3001,
        "measured_input_ms": {"0": 3.565, "1": 6.3147, "4": 7.4395},
    }
    front = FrontEnd.from_calibration(recorded, where)
    assert front.running_max == 4.0
    delays = front.input_delays_s(np.array([0, 4, 15]))
    assert delays[1] == pytest.approx((3.8739 + 4 * 1.1259) / 1000.0)
    assert delays[2] == delays[1]  # 15 running: held at what 4 measured, not 20.8 ms
    with pytest.raises(ValueError, match=r"measured_input_ms: expected running counts"):
        FrontEnd.from_calibration({**recorded, "measured_input_ms": {"idle": 3.0}}, where)


def test_running_at_send_counts_the_others_in_flight() -> None:
    sent = np.array([0.0, 0.1, 0.2, 1.0])
    reached = sent + 0.01
    raw = pd.DataFrame({"Request Id": [3, 2, 1, 0], "request_e2e_time": [0.5, 0.5, 0.5, 0.5]})
    assert vidur_metrics.VIDUR_ID == "Request Id"
    # request 1 sent at 0.1 sees 0 in flight; 2 sees 0 and 1; 3 (at 1.0) sees none left
    assert running_at_send(sent, reached, raw).tolist() == [0, 1, 2, 0]
    # N servers, each its own API server: only the requests on the same engine count
    on = raw.assign(engine=[1, 0, 1, 0])  # by id: 0 and 2 on engine 0, 1 and 3 on engine 1
    assert running_at_send(sent, reached, on, per_server=True).tolist() == [0, 0, 1, 0]
    assert running_at_send(sent, reached, on).tolist() == [0, 1, 2, 0]


def test_normalize_adds_the_front_end_to_ttft_and_e2e_not_tpot() -> None:
    rows = pd.DataFrame(
        {
            "prefill_e2e_time": [0.010],
            "request_e2e_time": [0.040],
            "request_scheduling_delay": [0.0],
            "request_preemption_time": [0.0],
            "request_num_restarts": [0],
            "request_execution_time": [0.04],
            "decode_time_execution_plus_preemption_normalized": [0.01],
        }
    )
    plain = vidur_metrics.normalize(rows, np.array([8]), np.array([4]), np.array([0.0]))
    # 6 ms on the way in, 1 ms on the way out
    shifted = vidur_metrics.normalize(
        rows, np.array([8]), np.array([4]), np.array([0.0]), np.array([0.006 + 0.001])
    )
    assert shifted["ttft_s"].iloc[0] == pytest.approx(plain["ttft_s"].iloc[0] + 0.007)
    assert shifted["e2e_s"].iloc[0] == pytest.approx(plain["e2e_s"].iloc[0] + 0.007)
    assert shifted["tpot_s"].iloc[0] == pytest.approx(plain["tpot_s"].iloc[0])


def test_running_at_send_counts_as_a_scan_of_every_request_would() -> None:
    rng = np.random.default_rng(7)
    sent = np.sort(rng.uniform(0, 10, 300))
    reached = np.maximum.accumulate(sent + rng.uniform(0, 0.05, 300))
    e2e = rng.uniform(0.01, 2.0, 300)
    raw = pd.DataFrame({"Request Id": np.arange(300)[::-1], "request_e2e_time": e2e[::-1]})
    done = reached + e2e
    scan = [
        sum(1 for j in range(300) if j != i and reached[j] <= t < done[j])
        for i, t in enumerate(sent)
    ]
    assert running_at_send(sent, reached, raw).tolist() == scan


def test_in_flight_at_each_send_counts_the_others_reached_and_not_finished() -> None:
    """What the replays' way in and the idle first tokens are read by: at its send, the other
    requests that had reached the engine and not finished; -1 for one without the stamps."""
    from types import SimpleNamespace

    from gpu_simulate_test.calibration.frontend import in_flight_at_sends

    def rec(sent: float | None, reached: float | None, done: float | None) -> Any:
        return SimpleNamespace(arrival_s=sent, engine_arrival_s=reached, engine_last_token=done)

    recs = [
        rec(0.0, 0.003, 0.050),  # alone: idle
        rec(0.010, 0.013, 0.060),  # the first in flight
        rec(0.055, 0.058, 0.070),  # the second still in flight, the first done
        rec(0.100, None, None),  # never reached: -1, and not counted for the others
        rec(0.101, 0.104, 0.110),  # nothing in flight
    ]
    assert in_flight_at_sends(recs) == [0, 1, 1, -1, 0]
