"""The real capacity search's rule on a known latency curve: each rate sized by time, the bracket
from a seed, the bisection's stop, the budget's stop, and the knobs that refuse to run."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from gpu_simulate_test.capacity.bracket import BracketRule, Stopped, bracket_search
from gpu_simulate_test.capacity.real_search import (
    RealSearch,
    plan_record,
    search_record,
    search_rule,
    seed_of,
)
from gpu_simulate_test.capacity.report import search_markdown, search_summary
from gpu_simulate_test.capacity.search import Answer, Point, judge
from gpu_simulate_test.config.capacity import CapacityOptions
from gpu_simulate_test.config.schema import ConfigError


def _curve(knee: float) -> Any:
    """TTFT p90 = 50 ms up to ``knee`` req/s, then rising steeply (goal: 100 ms, so the goal is
    missed above knee + 0.05); every call is recorded."""
    calls: list[tuple[float, str]] = []

    def evaluate(qps: float, phase: str) -> Point:
        calls.append((qps, phase))
        ttft = 50.0 if qps <= knee else 50.0 + 1000.0 * (qps - knee)
        latency = {"ttft_p90": ttft, "tpot_p90": 10.0, "e2e_p90": ttft + 100.0}
        meets, missed = judge(latency, {"ttft": 100.0}, 90)
        return Point(qps, phase, latency, meets, missed)

    evaluate.calls = calls  # type: ignore[attr-defined]
    return evaluate


def test_each_rate_replays_the_requests_of_its_seconds_within_floor_and_cap() -> None:
    opts = CapacityOptions(verify_seconds=30.0, verify_min_requests=32)
    assert opts.requests_at(10.0) == 300  # 30 s of arrivals at 10 req/s
    assert opts.requests_at(10.01) == 301  # ceil
    assert opts.requests_at(0.5) == 32  # 15 requests would say nothing at p90: the floor
    capped = CapacityOptions(verify_seconds=30.0, verify_min_requests=32, verify_requests=128)
    assert capped.requests_at(10.0) == 128 and capped.requests_at(0.5) == 32
    assert CapacityOptions(verify_seconds=4.0, verify_min_requests=16).requests_at(8.0) == 32


def test_a_seed_that_misses_steps_down_then_bisects_to_the_target() -> None:
    evaluate = _curve(knee=10.0)
    answer, stopped = bracket_search(evaluate, 40.0, BracketRule(step=2.0, bracket=0.1))
    assert stopped is None
    phases = [phase for _, phase in evaluate.calls]
    assert [q for q, _ in evaluate.calls[:3]] == [40.0, 20.0, 10.0]  # 10 met: bracketed
    assert phases[:3] == ["seed", "step", "step"] and set(phases[3:]) == {"bisect"}
    low, high = answer.bracket
    assert high is not None and answer.qps == low
    assert low <= 10.05 < high and high / low <= 1.1  # the knee, within 10%
    assert len(evaluate.calls) == 3 + 3  # 20/10 -> 14.14 -> 11.89 -> 10.9: three halvings
    assert [p.qps for p in answer.points] == sorted(q for q, _ in evaluate.calls)
    assert answer.note == ""


def test_a_seed_that_meets_steps_up() -> None:
    evaluate = _curve(knee=10.0)
    answer, _ = bracket_search(evaluate, 3.0, BracketRule(step=2.0, bracket=0.25))
    assert [q for q, _ in evaluate.calls[:4]] == [3.0, 6.0, 12.0, 8.485]  # then bisection
    low, high = answer.bracket
    assert low <= 10.05 < high and high / low <= 1.25  # type: ignore[operator]


def test_one_step_of_the_brackets_own_width_is_narrow_enough_despite_rounding() -> None:
    # tune.verify steps by 1 + margin and bisects to that width: 35.33 * 1.15 rounds to 40.63, a
    # ratio of 1.15001, which must not cost a bisection (three of four checks ran one on
    # 2026-11-28); a bracket wider by more than the rounding still bisects
    evaluate = _curve(knee=38.0)
    answer, _ = bracket_search(evaluate, 35.33, BracketRule(step=1.15, bracket=0.15))
    assert [q for q, _ in evaluate.calls] == [35.33, 40.63]
    assert answer.bracket == (35.33, 40.63) and answer.note == ""
    down = _curve(knee=48.0)
    bracket_search(down, 51.52, BracketRule(step=1.15, bracket=0.15))
    assert [q for q, _ in down.calls] == [51.52, 44.8]  # 51.52 / 44.8 = 1.1500000000000001
    wide = _curve(knee=38.0)
    bracket_search(wide, 35.33, BracketRule(step=1.152, bracket=0.15))
    assert [phase for _, phase in wide.calls] == ["seed", "step", "bisect"]


def test_small_steps_widen_until_they_bracket_a_capacity_far_from_the_seed() -> None:
    # tune.verify seeded a batch cap of 2 at its simulated 13.96 req/s; the server met the goals
    # only below 6: 15% steps missed six times, down to 6.04, and the check measured nothing
    # (CI, 2026-12-07). Widening squares the factor up to 2: 1.15, 1.3225, 1.749, then 2
    rule = search_rule(CapacityOptions(verify_step=1.15, verify_bracket=0.15))
    assert rule.widen_to == 2.0
    assert [round(rule.factor(k), 4) for k in range(5)] == [1.15, 1.3225, 1.749, 2.0, 2.0]
    far = _curve(knee=4.0)
    answer, _ = bracket_search(far, 13.96, rule)
    downs = [q for q, phase in far.calls if phase != "bisect"]
    assert downs == [13.96, 12.14, 9.18, 5.249, 2.624]  # 2.624 met: bracketed
    low, high = answer.bracket
    assert answer.qps == low and low <= 4.05 < high and high / low <= 1.15 * (1 + 1e-3)  # type: ignore[operator]
    # the same steps without widening: 2.3x down in six, never a rate that met the goals
    fixed = _curve(knee=4.0)
    answer, _ = bracket_search(fixed, 13.96, BracketRule(step=1.15, bracket=0.15))
    assert answer.qps is None and min(q for q, _ in fixed.calls) > 6.0
    # the capacity stage's default step of 2 is already as wide: unchanged
    assert search_rule(CapacityOptions()).factor(3) == 2.0


def test_no_bracket_within_the_steps_says_which_end() -> None:
    none = _curve(knee=0.01)
    answer, _ = bracket_search(none, 8.0, BracketRule(step=2.0, max_steps=3))
    assert [q for q, _ in none.calls] == [8.0, 4.0, 2.0, 1.0]
    assert answer.qps is None and answer.bracket == (0.0, 1.0)
    assert "even 1 req/s missed the goals" in answer.note
    every = _curve(knee=1000.0)
    answer, _ = bracket_search(every, 8.0, BracketRule(step=2.0, max_steps=2), unit="sessions/s")
    assert answer.qps == 32.0 and answer.bracket == (32.0, None)
    assert "32 sessions/s still met the goals" in answer.note


def test_the_budget_stops_before_a_rate_that_would_not_fit_and_says_so() -> None:
    """Each rate is expected to take 30 s; the clock advances by each evaluation's 30 s: a
    budget of 100 s runs three rates (90 s) and refuses the fourth (30 s > 10 s left)."""
    clock = {"now": 0.0}
    curve = _curve(knee=10.0)

    def evaluate(qps: float, phase: str) -> Point:
        clock["now"] += 30.0
        return curve(qps, phase)

    answer, stopped = bracket_search(
        evaluate,
        40.0,
        BracketRule(step=2.0, bracket=0.01, budget_s=100.0),
        expected_s=lambda qps: 30.0,
        elapsed_s=lambda: clock["now"],
    )
    assert [q for q, _ in curve.calls] == [40.0, 20.0, 10.0]
    assert stopped is not None and stopped.next_qps == 14.14
    assert stopped.to_dict() == {"next_qps": 14.14, "expected_s": 30.0, "left_s": 10.0}
    assert answer.qps == 10.0 and answer.bracket == (10.0, 20.0)  # the bracket so far
    assert "stopped by capacity.verify_budget_s=100: the next rate, 14.14 req/s" in answer.note
    assert "wider than capacity.verify_bracket=0.01" in answer.note
    # not even the seed fits: nothing run, no answer, and said
    nothing, first = bracket_search(
        curve, 40.0, BracketRule(budget_s=10.0), expected_s=lambda qps: 30.0
    )
    assert first is not None and nothing.qps is None and nothing.points == ()
    assert "no rate was run" in nothing.note and "stopped by" in nothing.note


def test_the_seed_is_the_simulated_answer_unless_a_probe_is_asked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpu_simulate_test.capacity import real_search

    probed: list[int] = []

    def probe(cfg: Any, run_id: str, size: int) -> dict[str, Any]:
        probed.append(size)
        return {"capacity_qps": 12.5, "probe_requests": size, "probe_run": run_id}

    monkeypatch.setattr(real_search, "measure_capacity", probe)
    monkeypatch.setattr(real_search, "probe_size", lambda cfg, n: n or 64)
    auto = CapacityOptions()
    seed = seed_of(auto, None, 7.0)  # type: ignore[arg-type]
    assert seed == {"from": "simulated", "qps": 7.0, "probe": None} and probed == []
    seed = seed_of(auto, None, None)  # type: ignore[arg-type]  # phase=real: nothing simulated
    assert seed["from"] == "probe" and seed["qps"] == 12.5 and probed == [64]
    assert seed["probe"]["wall_s"] >= 0 and seed["probe"]["probe_run"] == "search-probe"
    forced = CapacityOptions(verify_seed="probe", verify_probe_requests=40)
    assert seed_of(forced, None, 7.0)["from"] == "probe" and probed[-1] == 40  # type: ignore[arg-type]


def test_the_record_says_how_the_search_was_seeded_run_and_stopped() -> None:
    met = Point(5.0, "step", {"ttft_p90": 40.0}, True, (), 25.0)
    missed = Point(10.0, "seed", {"ttft_p90": 400.0}, False, ("ttft_p90 400.0 > 100",), 40.0)
    runs = [
        {"qps": 10.0, "phase": "seed", "requests": 150, "arrivals_s": 15.0, "wall_s": 40.0,
         "real_run": "r/10", "meets_slo": False, "truth": "", "disturbed": False},
        {"qps": 5.0, "phase": "step", "requests": 75, "arrivals_s": 15.0, "wall_s": 25.0,
         "real_run": "r/5", "meets_slo": True, "truth": "", "disturbed": True},
    ]  # fmt: skip
    opts = CapacityOptions(verify_seconds=15.0, verify_budget_s=70.0)
    found = RealSearch(
        Answer(5.0, (5.0, 10.0), (met, missed), "stopped by ..."),
        runs,
        81.0,
        {"from": "probe", "qps": 10.0, "probe": {"capacity_qps": 10.0, "wall_s": 16.0}},
        plan_record(opts),
        {"next_qps": 7.071, "expected_s": 30.0, "left_s": -11.0},
    )
    simulated = Answer(8.0, (8.0, 16.0), (Point(8.0, "grid", {"ttft_p90": 60.0}, True),))
    at_real = (
        Point(5.0, "real-rate", {"ttft_p90": 44.0}, True),
        Point(10.0, "real-rate", {"ttft_p90": 300.0}, False),
    )
    doc = search_record(simulated, found, ("ttft_p90",), at_real)
    assert doc["measured_capacity_qps"] == 5.0 and doc["ratio"] == pytest.approx(1.6)
    assert doc["seed"]["from"] == "probe" and doc["plan"]["seconds"] == 15.0
    assert doc["plan"]["budget_s"] == 70.0 and doc["stopped"]["next_qps"] == 7.071
    assert doc["disturbed_rates"] == [5.0] and doc["wall_time_s"] == 81.0
    assert "requests_per_rate" not in doc
    # the simulated latency at the real rates: their errors, where the real engine met the goal
    agreement = doc["latency_agreement"]
    assert agreement["rates"] == [5.0, 10.0] and agreement["met_rates"] == [5.0]
    assert agreement["errors"]["ttft_p90"][0] == pytest.approx(44.0 / 40.0 - 1)
    said = search_summary(doc)
    assert "2 rates of 15 s of arrivals, 75–150 requests each" in said
    # judged on the whole workload, the simulated side's requests are not the real side's: said
    paragraph = "\n".join(search_markdown(doc, 90, whole=1000))
    assert "Not the same requests: each simulated rate judged the whole workload (1000" in paragraph
    assert "its first ⌈rate × 15 s⌉" in paragraph
    assert "Not the same requests" not in "\n".join(search_markdown(doc, 90))
    assert "from 10 req/s (a burst probe)" in said
    assert "stopped by its budget of 70 s before 7.071 req/s" in said
    # one rate is one rate, not "1 rates"
    one = search_summary({**doc, "runs": doc["runs"][:1]})
    assert one.startswith("1 rate of 15 s of arrivals, 150 requests each")


def test_a_bracket_left_wide_judges_no_ratio_and_no_band() -> None:
    # a budget that stopped one step above the seed (the simulated answer, 21 req/s) read "the
    # simulated answer is 1.00x it" and "inside the band" of a bracket 21..42 (2026-12-07)
    met = Point(21.0, "seed", {"ttft_p90": 60.0}, True)
    missed = Point(42.0, "step", {"ttft_p90": 900.0}, False, ("ttft_p90 900.0 > 100",))
    plan = plan_record(CapacityOptions(verify_budget_s=90.0))
    stopped = {"next_qps": 29.7, "expected_s": 40.0, "left_s": -80.3}
    wide = RealSearch(Answer(21.0, (21.0, 42.0), (met, missed)), [], 170.3, {}, plan, stopped)
    simulated = Answer(21.0, (21.0, 23.0), (met,))
    doc = search_record(simulated, wide, ("ttft_p90",))
    assert doc["bracket_narrow"] is False and doc["ratio"] == 1.0
    said = "\n".join(search_markdown(doc, 90))
    assert "1.00× its low end, but the search did not narrow its bracket" in said
    assert "the capacity lies somewhere in 21..42 req/s" in said and "**1.00×**" not in said
    # the same bracket, not stopped but wider than asked: still wide
    unstopped = dataclasses.replace(wide, stopped=None)
    assert search_record(simulated, unstopped)["bracket_narrow"] is False
    # narrowed as asked (42 / 39 <= 1.1): judged
    close = Answer(39.0, (39.0, 42.0), (Point(39.0, "bisect", {}, True), missed))
    narrow = dataclasses.replace(unstopped, measured=close)
    doc = search_record(simulated, narrow)
    assert doc["bracket_narrow"] is True
    assert "the simulated answer is **0.54×** it." in "\n".join(search_markdown(doc, 90))
    # a budget already overrun says by how much, not "0 s were left"
    overrun = Stopped(29.7, 40.0, -80.3).sentence(90.0, "req/s")
    assert "had already run 80 s past it" in overrun and "0 s were left" not in overrun


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"verify_seconds": 0.0}, r"capacity\.verify_seconds=0\.0 must be > 0"),
        ({"verify_seconds": math.inf}, r"capacity\.verify_seconds=inf must be > 0"),
        ({"verify_min_requests": 4}, r"capacity\.verify_min_requests must be >= 8"),
        (
            {"verify_requests": 16},
            r"capacity\.verify_requests=16 caps each rate below capacity\.verify_min_requests=32",
        ),
        ({"verify_seed": "sim"}, r"capacity\.verify_seed='sim' must be one of auto, probe"),
        ({"verify_step": 1.0}, r"capacity\.verify_step=1\.0 must be a factor > 1"),
        ({"verify_bracket": 0.0}, r"capacity\.verify_bracket=0\.0 must be > 0"),
        ({"verify_budget_s": -1.0}, r"capacity\.verify_budget_s=-1\.0 must be >= 0"),
        ({"verify_probe_requests": -1}, r"capacity\.verify_probe_requests must be >= 0"),
    ],
)
def test_real_search_knobs_out_of_range_are_refused_naming_them(
    knobs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        CapacityOptions(**knobs)


def test_a_knob_of_the_old_grid_search_is_refused_by_name(compose_stage: Any) -> None:
    from gpu_simulate_test.config.capacity import CapacityStageConfig
    from gpu_simulate_test.config.registry import to_typed

    with pytest.raises(Exception, match="verify_stop_after"):
        to_typed(compose_stage("capacity", ["capacity.verify_stop_after=2"]), CapacityStageConfig)
    cfg = to_typed(compose_stage("capacity", ["capacity.verify_requests=128"]), CapacityStageConfig)
    assert cfg.capacity.requests_at(100.0) == 128  # kept, as a cap
