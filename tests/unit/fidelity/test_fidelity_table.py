"""The fidelity harness's pure parts: capacity rule, load levels, table and largest error."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.capacity.contract import RATE_UNITS
from gpu_simulate_test.core.metrics import capacity_probe, window
from gpu_simulate_test.fidelity import report
from gpu_simulate_test.fidelity import tables as fid


def test_burst_capacity_is_completions_over_the_span() -> None:
    # 4 requests at t=0 finishing at 1, 2, 3, 4 s; one failed request is not counted
    arrival = np.zeros(5)
    e2e = np.array([1.0, 2.0, 3.0, 4.0, np.nan])
    ok = np.array([True, True, True, True, False])
    assert capacity_probe.burst_capacity(arrival, e2e, ok) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="no request completed"):
        capacity_probe.burst_capacity(arrival, e2e, np.zeros(5, dtype=bool))


def test_probe_record_of_a_burst_and_of_one_that_completed_nothing() -> None:
    from gpu_simulate_test.io.artifacts import ArtifactError

    requests = pd.DataFrame(
        {
            "arrival_time_s": np.zeros(5),
            "e2e_s": [1.0, 2.0, 3.0, 4.0, np.nan],
            "status": ["ok"] * 4 + ["error"],
            "num_decode_tokens": [10, 10, 10, 10, 10],
        }
    )
    record = capacity_probe.probe_record(requests, "runs/probe")
    assert record == {
        "probe_requests": 5,
        "probe_ok": 4,
        "probe_run": "runs/probe",
        "capacity_qps": 1.0,
        "output_tokens_per_s": 10.0,  # the 40 tokens of the ok requests over 4 s
    }
    requests["status"] = "error"
    with pytest.raises(
        ArtifactError, match=r"^runs/probe: capacity probe: no request completed; see"
    ):
        capacity_probe.probe_record(requests, "runs/probe", "see its run_meta.json")


def test_a_multi_turn_probe_gives_sessions_per_second_over_its_turns() -> None:
    # 12 requests of 4 sessions completed at 6 req/s: 3 turns per session, 2 sessions/s
    record = {"probe_requests": 12, "probe_ok": 12, "probe_run": "p", "capacity_qps": 6.0}
    cap = capacity_probe.session_capacity(record, 4)
    assert cap["capacity_qps"] == pytest.approx(2.0)
    assert cap["request_capacity_qps"] == 6.0
    assert cap["turns_per_session"] == 3.0
    assert fid.rate_unit(cap) == "sessions/s"
    assert fid.rate_unit(record) == "req/s"
    assert RATE_UNITS[1] == capacity_probe.SESSION_UNIT  # core's copy of the contract's unit
    # the load levels scale the session rate; the report says the unit and the request rate
    assert fid.load_levels(cap["capacity_qps"], (0.5,)) == [(0.5, 1.0)]
    assert report.capacity_cell(record) == "6 req/s"
    cell = report.capacity_cell(cap)
    assert cell.startswith("2 sessions/s (6 req/s over 3 turns per session; 4 sessions")
    with pytest.raises(ValueError, match="without sessions"):
        capacity_probe.session_capacity(record, 0)


def test_completion_ratio_flags_a_growing_queue() -> None:
    arrival = np.arange(11, dtype=float)  # 1 req/s for 10 s
    kept_up = np.full(11, 0.5)  # every request takes 0.5 s: completions at 1 req/s
    assert window.completion_ratio(arrival, kept_up) == pytest.approx(1.0)
    assert fid.is_sustained(1.0)
    # served one after another at 2 s each: completions every 2 s, the queue grows
    finish = 2.0 * np.arange(1, 12)
    ratio = window.completion_ratio(arrival, finish - arrival)
    assert ratio == pytest.approx(0.5)
    assert not fid.is_sustained(ratio)
    assert not fid.is_sustained(float("nan"))
    assert math.isnan(window.completion_ratio(arrival[:1], kept_up[:1]))


def test_load_levels() -> None:
    assert fid.load_levels(10.0) == [(0.2, 2.0), (0.5, 5.0), (0.85, 8.5)]
    assert fid.load_levels(1.23456, (0.5,)) == [(0.5, 0.6173)]
    with pytest.raises(ValueError, match="positive"):
        fid.load_levels(0.0)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        fid.load_levels(5.0, (1.5,))


def _percentiles(scale: float) -> pd.DataFrame:
    rows = []
    for metric, base in (("ttft", 10.0), ("tpot", 5.0), ("e2e", 100.0), ("itl", 4.0)):
        for stat in ("p50", "p90", "p99"):
            rows.append({"metric": metric, "stat": stat, "real_ms": base, "sim_ms": base * scale})
    return pd.DataFrame(rows)


def test_table_keeps_goal_rows_and_finds_the_largest_error() -> None:
    levels = [
        ("hf_cb", 0.2, 2.0, _percentiles(0.9)),  # -10%
        ("hf_cb", 0.85, 8.5, _percentiles(1.3)),  # +30%
        ("hf_generate", 0.5, 1.0, _percentiles(0.5)),  # -50%
    ]
    table = fid.fidelity_rows(levels)
    # 3 loads x 3 metrics (itl dropped) x p50/p90 (p99 dropped)
    assert len(table) == 18
    assert set(table["metric"]) == {"ttft", "tpot", "e2e"}
    assert set(table["stat"]) == {"p50", "p90"}
    cb = table[table["backend"] == "hf_cb"]
    assert cb["rel_error"].round(6).tolist().count(-0.1) == 6
    worst = fid.largest_abs_error(table)
    assert worst["abs_error_pct"] == pytest.approx(50.0)
    assert worst["backend"] == "hf_generate"
    assert fid.largest_abs_error(cb)["abs_error_pct"] == pytest.approx(30.0)
    assert fid.largest_abs_error(cb)["load_fraction"] == 0.85
    assert worst["clock"] == "client"  # the rows' clock, named
    assert "clock" not in fid.largest_abs_error(table.drop(columns="clock"))  # none: none named
    on_engine = fid.largest_abs_error(table.assign(clock="engine"))
    assert on_engine["clock"] == "engine" and on_engine["abs_error_pct"] == pytest.approx(50.0)


def test_json_largest_error_ignores_non_finite_rows() -> None:
    pct = _percentiles(1.2)
    pct.loc[0, "real_ms"] = 0.0  # an undefined error (real 0 ms) must not win
    table = fid.fidelity_rows([("hf_cb", 0.5, 3.0, pct)])
    assert table["rel_error"].isna().sum() == 1
    cap = {"hf_cb": {"probe_requests": 8, "capacity_qps": 6.0, "loads": []}}
    doc = fid.fidelity_json("t", {"device": "cpu"}, cap, table)
    assert doc["device"] == "cpu"
    assert doc["largest_abs_error"]["abs_error_pct"] == pytest.approx(20.0)
    assert doc["largest_abs_error_by_backend"]["hf_cb"]["abs_error_pct"] == pytest.approx(20.0)
    assert any(row["rel_error"] is None for row in doc["rows"])
    empty = fid.fidelity_rows([])
    assert fid.largest_abs_error(empty) == {"abs_error_pct": None}


def test_error_spread_and_summary_over_reports() -> None:
    table = pd.DataFrame(
        {
            "backend": ["a", "a", "a", "b", "b"],
            "metric": ["ttft", "tpot", "e2e", "ttft", "tpot"],
            "stat": ["p50"] * 5,
            "load_fraction": [0.2] * 5,
            "abs_rel_error": [0.04, 0.08, 0.30, 0.05, float("nan")],
        }
    )
    spread = fid.error_spread(table[table["backend"] == "a"])
    assert spread == {
        "rows": 3, "median_abs_error_pct": 8.0, "within_5pct": 1, "within_10pct": 2,
        "mean_signed_error_pct": None,  # no signed column: no bias to tell
    }  # fmt: skip
    # the bias beside the spread: the simulation's from rel_error, the noise floor's from noise
    signed = table.assign(
        rel_error=[-0.04, 0.08, 0.30, 0.05, float("nan")],
        noise=[0.02, -0.06, float("nan"), 0.01, 0.01],
    )
    a = signed[signed["backend"] == "a"]
    assert fid.error_spread(a)["mean_signed_error_pct"] == pytest.approx(11.33)
    assert fid.error_spread(a, "noise")["mean_signed_error_pct"] == pytest.approx(-2.0)
    assert fid.error_spread(table[table["backend"] == "b"])["rows"] == 1  # NaN left out
    summary = report.summary_table(
        [{"name": "r1", "requests_per_load": 64, "rows": table.to_dict("records")}]
    )
    assert "| r1 | 64 | a | 30.0% | 8.0% | 1/3 | 2/3 | – | – |" in summary
    assert "| r1 | 64 | b | 5.0% | 5.0% | 1/1 | 1/1 | – | – |" in summary
    noisy = table.assign(
        noise=[0.1, -0.3, 0.0, float("nan"), float("nan")],
        rel_error=[-0.04, 0.08, 0.30, 0.05, float("nan")],
    )
    summary = report.summary_table([{"name": "r2", "rows": noisy.to_dict("records")}])
    assert "| r2 |  | a | 30.0% | 8.0% | 1/3 | 2/3 | +11.3% | 30.0% / 10.0% / -6.7% |" in summary


def test_noise_floor_is_the_repeat_furthest_from_the_first_run() -> None:
    requests = pd.DataFrame(
        {
            "status": ["ok", "ok", "ok", "error"],
            "ttft_s": [0.010, 0.020, 0.030, 9.0],
            "tpot_s": [0.001, 0.001, 0.001, 9.0],
            "e2e_s": [0.1, 0.2, 0.3, 9.0],
        }
    )
    pct = fid.real_percentiles(requests)
    assert pct[("client", "ttft", "p50")] == pytest.approx(20.0)  # the failed one left out
    assert pct[("client", "e2e", "p90")] == pytest.approx(280.0)
    assert not any(clock == "engine" for clock, _, _ in pct)  # no engine clock recorded
    table = pd.DataFrame(
        {
            "backend": ["a", "a", "b"],
            "load_fraction": [0.2, 0.2, 0.2],
            "metric": ["ttft", "e2e", "ttft"],
            "stat": ["p50", "p90", "p50"],
            "real_ms": [25.0, 280.0, 10.0],
            "abs_rel_error": [0.1, 0.2, 0.3],
        }
    )
    again = {("client", "ttft", "p50"): 22.0, ("client", "e2e", "p90"): 280.0}
    out = fid.add_noise(table, {("a", 0.2): [pct, again]})
    assert out["real_repeat_ms"].iloc[0] == pytest.approx(20.0)  # -20% beats -12%
    assert out["noise"].iloc[0] == pytest.approx(-0.2)
    assert out["noise"].iloc[1] == pytest.approx(0.0)
    assert math.isnan(out["noise"].iloc[2])  # backend b was not repeated
    assert fid.has_noise(out) and not fid.has_noise(table)
    assert fid.error_spread(out, "noise")["rows"] == 2


def test_the_engine_clock_heads_the_table_and_judges_the_campaign() -> None:
    def percentiles(clock: str, real: float, sim: float) -> pd.DataFrame:
        return pd.DataFrame(
            {
                "clock": [clock] * 2,
                "metric": ["ttft", "tpot"],
                "stat": ["p50", "p50"],
                "real_ms": [real, real],
                "sim_ms": [sim, sim],
            }
        )

    both = pd.concat([percentiles("client", 100.0, 50.0), percentiles("engine", 55.0, 50.0)])
    table = fid.fidelity_rows(
        [("vllm_engine", 0.5, 3.0, both), ("vllm", 0.5, 3.0, percentiles("client", 10.0, 12.0))]
    )
    engine_first = table[table["backend"] == "vllm_engine"]["clock"].tolist()
    assert engine_first == ["engine", "engine", "client", "client"]
    judged = fid.headline(table)
    # vllm_engine on its engine clock (-9.1%), vllm without one on the client's (+20%)
    assert fid.clock_of(table) == {"vllm_engine": "engine", "vllm": "client"}
    assert set(judged["clock"]) == {"engine", "client"} and len(judged) == 4
    doc = fid.fidelity_json("x", {}, {}, table)
    assert doc["largest_abs_error_by_backend"]["vllm_engine"]["abs_error_pct"] == pytest.approx(
        9.09, abs=0.01
    )
    assert doc["by_clock"]["vllm_engine"]["client"]["largest"]["abs_error_pct"] == 50.0
    text = report.markdown("x", {}, {}, table, {})
    assert "judged on the clock vllm: client, vllm_engine: engine" in text
    assert "- vllm_engine, client clock: 50.0%" in text
    # what a run did not record is left out, not printed as None
    setup = {"device": "cpu", "driver": None, "real_runs": None,
             "versions": {"torch": "2.13.0+cpu", "cuda": None}, "host": {"gpu": None}}  # fmt: skip
    text = report.markdown("x", setup, {}, table, {})
    assert "- device: cpu" in text and "None" not in text
    assert "- versions: torch 2.13.0+cpu\n" in text and "- host: not recorded" in text


def test_real_percentiles_read_the_engine_clock_after_the_warm_up() -> None:
    requests = pd.DataFrame(
        {
            "request_id": range(4),
            "arrival_time_s": [0.0, 1.0, 2.0, 3.0],
            "status": ["ok"] * 4,
            "ttft_s": [9.0, 0.020, 0.030, 0.040],
            "tpot_s": [0.001] * 4,
            "e2e_s": [9.0, 0.2, 0.3, 0.4],
            "engine_ttft_s": [9.0, 0.010, 0.020, 0.030],
            "engine_tpot_s": [0.001] * 4,
            "engine_e2e_s": [9.0, 0.1, 0.2, 0.3],
        }
    )
    pct = fid.real_percentiles(requests, warmup_s=0.5)  # the first request warms up
    assert pct[("client", "ttft", "p50")] == pytest.approx(30.0)
    assert pct[("engine", "ttft", "p50")] == pytest.approx(20.0)
    assert fid.real_percentiles(requests)[("engine", "ttft", "p90")] > 1000  # with it


def test_the_front_end_attribution_is_one_span_on_both_sides() -> None:
    ttft = {"client": 30.0, "server": 27.0, "sim": 26.0, "sim_frontend": 4.0}
    now = fid.step_attribution({"ttft_ms": {**ttft, "engine": 20.0, "sim_engine": 18.0}})
    assert now["real_frontend_ms"] == pytest.approx(10.0)
    assert now["sim_frontend_ms"] == pytest.approx(8.0)
    # a comparison from before the engine-clock means reads as it was reported then
    before = fid.step_attribution({"ttft_ms": ttft})
    assert before["real_frontend_ms"] == pytest.approx(3.0)
    assert before["sim_frontend_ms"] == pytest.approx(4.0)


def test_the_loads_table_gives_the_offered_rate_and_the_realized_one_apart() -> None:
    """The table gave the offered rate (3.6 req/s) and the plot and the loads' compare the
    realized one (4.65) under one name: both are said, each by its name."""
    level: dict[str, Any] = {
        "load_fraction": 0.3, "offered_qps": 3.6, "realized_qps": 4.6512, "sustained": True,
        "completion_ratio": 1.0, "window": {"requests_measured": 16, "requests_warmup": 0},
    }  # fmt: skip
    cap = {"capacity_qps": 12.0, "loads": [level]}
    row = report.loads_lines({"hf_cb": cap})[-1]
    assert row.startswith("| hf_cb | 30% | 3.6 req/s | 4.651 | 16 (0) | 1.00 |")
    older = {**cap, "loads": [{**level, "realized_qps": None}]}
    assert "| 3.6 req/s | – |" in report.loads_lines({"hf_cb": older})[-1]
