"""Each load simulated again at its real run's own step level: the table's columns, the report's
section and the verdict's line beside the simulation as calibrated (hand-computed values)."""

from __future__ import annotations

import pandas as pd
import pytest

from gpu_simulate_test.fidelity import tables as fid
from gpu_simulate_test.fidelity.at_level import at_level_json, at_level_lines
from gpu_simulate_test.fidelity.verdict import verdict_lines


def _percentiles(real: float, sim: float) -> pd.DataFrame:
    rows = [
        {"clock": clock, "metric": m, "stat": s, "real_ms": real, "sim_ms": sim}
        for clock in ("engine", "client")
        for m in ("ttft", "tpot", "e2e")
        for s in ("p50", "p90")
    ]
    return pd.DataFrame(rows)


def _table() -> pd.DataFrame:
    # at 20% the simulation is 5% slow; at 85% 40% slow, and the real server ran its steps 1.3x
    # the model's there: simulated at that level the error is +2%
    levels = [
        ("vllm", 0.2, 10.0, _percentiles(100.0, 105.0)),
        ("vllm", 0.85, 42.0, _percentiles(100.0, 140.0)),
    ]
    at_level = {
        ("vllm", 0.85): {
            (c, m, s): 102.0
            for c in ("engine", "client")
            for m in ("ttft", "tpot", "e2e")
            for s in ("p50", "p90")
        }
    }
    return fid.add_at_level(fid.fidelity_rows(levels), at_level)


CAPACITY = {
    "vllm": {
        "loads": [
            {"load_fraction": 0.2, "real_step_level": None},
            {
                "load_fraction": 0.85,
                "real_step_level": {"ratio": 1.3, "steps": 900, "front_end": True},
            },
        ]
    }
}


def test_rows_of_a_load_with_a_level_get_its_error_there() -> None:
    table = _table()
    assert fid.has_at_level(table)
    high = table[table["load_fraction"] == 0.85]
    assert high["rel_error"].tolist() == pytest.approx([0.4] * 12)
    assert high["rel_error_at_level"].tolist() == pytest.approx([0.02] * 12)
    low = table[table["load_fraction"] == 0.2]
    assert low["sim_at_level_ms"].isna().all()  # no level at 20%: nothing simulated there
    assert not fid.has_at_level(fid.add_at_level(table.drop(columns=["sim_at_level_ms",
        "rel_error_at_level"]), {}))  # fmt: skip


def test_the_report_and_json_say_both_and_which_is_which() -> None:
    table = _table()
    record = at_level_json(table, CAPACITY)
    assert record is not None
    assert [lv["ratio"] for lv in record["levels"]] == [None, 1.3]
    assert [lv["front_end"] for lv in record["levels"]] == [None, True]  # the front end scaled
    engine = record["spread_by_clock"]["vllm"]["engine"]
    assert engine["as_calibrated"]["rows"] == 12 and engine["as_calibrated"]["within_10pct"] == 6
    assert engine["at_level"]["rows"] == 6 and engine["at_level"]["within_10pct"] == 6
    assert engine["at_level"]["mean_signed_error_pct"] == pytest.approx(2.0)
    text = "\n".join(at_level_lines(table, CAPACITY))
    assert "## At the real runs' own step level" in text
    assert "Levels: vllm 20%: –, vllm 85%: 1.30×." in text
    assert "| vllm | engine | 12 | 6 | 6 of 6 | 22.5% | 2.0% | +22.5% | +2.0% |" in text
    assert at_level_lines(fid.fidelity_rows([("vllm", 0.2, 10.0, _percentiles(1, 1))]), {}) == []


def test_the_verdict_judges_as_calibrated_and_shows_the_level_beside() -> None:
    lines = verdict_lines(_table(), None)
    engine = next(i for i, line in enumerate(lines) if "vllm, engine clock" in line)
    assert "6 of 12 rows within max(10%, real vs real)" in lines[engine]
    assert lines[engine + 1].startswith("  - at the real runs' own step level (a diagnosis")
    assert "6 of 6 within; mean signed +2.0%, one-signed: every row too slow" in lines[engine + 1]
