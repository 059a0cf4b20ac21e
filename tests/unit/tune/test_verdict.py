"""The tune's verdict: no winner inside the spread between servers, the ranking whose picks were
measured is the one judged, and the report opens with it (issue 64's tune, figures from it)."""

from __future__ import annotations

from typing import Any

from gpu_simulate_test.tune.verdict import judged, verdict_lines

SPREAD = 0.35


def _row(config_id: str, simulated: float, measured: float | None, **more: Any) -> dict:
    return {"config_id": config_id, "simulated_qps": simulated, "measured_qps": measured, **more}


# the default tune of issue 64: the first calibration's top picks measured; two of them differ
# only in prefix caching on a workload without shared prefixes (the same engine)
FIRST = [
    _row("s32-t512-pc", 68.0, 51.0),
    _row("s32-t256-nopc", 66.0, 58.9),
    _row("s32-t256-pc", 65.0, 77.89),
]


def test_capacities_within_the_spread_are_a_tie_not_a_winner() -> None:
    got = judged(FIRST, SPREAD)
    assert got["tied_best"] == ["s32-t256-pc", "s32-t256-nopc"]  # 77.89 / 58.9 = 1.32
    assert got["winner"] is None and got["agrees"] is True  # s32-t256-nopc is in the top 2
    assert got["judged_ranking"] == "simulation"
    assert got["judged_top2"] == ["s32-t512-pc", "s32-t256-nopc"]
    # a narrower spread names the winner, and the top 2 then misses it
    narrow = judged(FIRST, 0.1)
    assert narrow["tied_best"] == ["s32-t256-pc"] and narrow["winner"] == "s32-t256-pc"
    assert narrow["agrees"] is False


def test_after_a_recalibration_the_first_ranking_is_judged() -> None:
    # the adopted calibration re-simulated the checked rows (reordered by it), keeping the
    # first calibration's capacity: its top 2 is what was measured
    again = [
        _row("s32-t256-pc", 80.0, 77.89, first_calibration_qps=65.0),
        _row("s32-t256-nopc", 79.0, 58.9, first_calibration_qps=66.0),
        _row("s32-t512-pc", 70.0, 51.0, first_calibration_qps=68.0),
    ]
    got = judged(again, SPREAD)
    assert got["judged_ranking"] == "first calibration"
    assert got["judged_top2"] == ["s32-t512-pc", "s32-t256-nopc"]


def test_nothing_measured_is_neither_agreement_nor_a_miss() -> None:
    got = judged([_row("a", 10.0, None), _row("b", 9.0, None)], SPREAD)
    assert got["tied_best"] == [] and got["winner"] is None and got["agrees"] is None


def _doc(best: str, verify: dict | None) -> dict:
    return {
        "objective": "capacity",
        "best": {"config_id": best, "score": 90.0},
        "configured_score": 60.0,
        "verify": verify,
    }


def test_the_verdict_says_the_tie_and_that_the_recommendation_was_not_measured() -> None:
    verify = {"configs": FIRST, **judged(FIRST, SPREAD)}
    lines = verdict_lines(_doc("s16-t256-pc", verify))
    assert lines[0].startswith("Recommended: s16-t256-pc (simulated capacity 90 req/s")
    assert "a tie, no winner — s32-t256-pc 77.9, s32-t256-nopc 58.9 req/s" in lines[1]
    assert "within the spread between servers (35%)" in lines[1]
    assert "The recommendation was not measured" in lines[2]
    assert "Judged: the simulation's ranking" in lines[3] and "holds a tied best" in lines[3]


def test_the_verdict_names_a_winner_outside_the_spread() -> None:
    rows = [_row("a", 70.0, 80.0), _row("b", 60.0, 50.0)]
    lines = verdict_lines(_doc("a", {"configs": rows, **judged(rows, SPREAD)}))
    assert "best a 80 req/s, 60% above the next (outside the 35% spread" in lines[1]
    assert "measured 80 req/s (among the measured best)" in lines[2]
    assert "holds the measured best" in lines[3]
    unchecked = verdict_lines(_doc("a", None))
    assert unchecked[-1].startswith("Not checked on the real engine")


def test_a_tune_json_written_before_the_verdict_is_judged_when_read() -> None:
    lines = verdict_lines(_doc("s32-t512-pc", {"configs": FIRST}))  # no tied_best in it
    assert "a tie, no winner — s32-t256-pc 77.9, s32-t256-nopc 58.9 req/s" in lines[1]
    assert "measured 51 req/s (not the measured best)" in lines[2]
