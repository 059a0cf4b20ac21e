"""``tune.recalibrate``: when it calibrates again, how the checked servers choose between the two
calibrations (their recorded steps against each), and what an adopted calibration changes in
the verify record and the report."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpu_simulate_test.capacity.real_search import RealSearch
from gpu_simulate_test.capacity.search import Answer, Point
from gpu_simulate_test.config.capacity import CapacityOptions, SloConfig
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.tune import TuneOptions, TuneStageConfig
from gpu_simulate_test.tune.recalibrate import Recalibrated, adopt_rows, closer
from gpu_simulate_test.tune.report import recalibration_sentence, verify_markdown
from gpu_simulate_test.tune.verify import judged_level, server_level, summary
from tests.unit.calibration.test_level import DATA, fitted_model, slower
from tests.unit.tune.test_tune import sim
from tests.unit.vidur_simulate.test_vidur_plan import CPU


class _Cfg:
    def __init__(self, recalibrate: str) -> None:
        self.tune = TuneOptions(space={"max_num_seqs": [2]}, recalibrate=recalibrate)


def _verified(note: str) -> dict[str, Any]:
    return {"configs": [], "calibration_speed": {"pooled_level": 0.88, "note": note}}


def test_the_option_takes_auto_always_off_and_booleans() -> None:
    assert TuneOptions(recalibrate="true").recalibrate == "auto"
    assert TuneOptions(recalibrate=False).recalibrate == "off"  # type: ignore[arg-type]
    assert TuneOptions(recalibrate="always").recalibrate == "always"
    with pytest.raises(ConfigError, match=r"tune\.recalibrate='sometimes' must be one of"):
        TuneOptions(recalibrate="sometimes")


def test_it_calibrates_again_on_the_note_or_when_always_and_never_when_off() -> None:
    from gpu_simulate_test.tune.recalibrate import wanted

    note = "every server checked (4) ran faster than the calibration's step model"
    assert wanted(_Cfg("auto"), _verified(note)) == note  # type: ignore[arg-type]
    assert wanted(_Cfg("auto"), _verified("")) == ""  # type: ignore[arg-type]
    assert wanted(_Cfg("always"), _verified("")) == "tune.recalibrate=always"  # type: ignore[arg-type]
    assert wanted(_Cfg("off"), _verified(note)) == ""  # type: ignore[arg-type]
    assert wanted(_Cfg("always"), None) == ""  # type: ignore[arg-type]


def test_the_second_calibration_is_adopted_only_when_the_servers_are_closer_to_it() -> None:
    assert closer({"pooled_level": 0.887}, {"pooled_level": 0.97})
    assert closer({"pooled_level": 1.175}, {"pooled_level": 0.95})
    assert not closer({"pooled_level": 0.887}, {"pooled_level": 0.85})
    assert not closer({"pooled_level": 0.95}, {"pooled_level": 1.05})  # as far: keep the first
    assert not closer({"pooled_level": 0.887}, None)  # no level against the second
    assert not closer({}, {"pooled_level": 1.0})  # none against the first


def _search(tmp_path: Path, config_id: str, rates: dict[float, bool], factor: float) -> RealSearch:
    """A real search whose judged runs carry the step record of tests/data (each step
    ``factor`` times as long), and a disturbed run beside them that it did not judge."""
    steps = pd.read_csv(DATA / "engine_schedule.csv")
    runs = []
    for qps in rates:
        for name, f in ((f"search-{qps:g}", factor), (f"search-{qps:g}-rerun1", 3.0)):
            where = tmp_path / config_id / "real_bench" / name
            where.mkdir(parents=True)
            slower(steps, f).to_csv(where / "engine_schedule.csv", index=False)
        runs.append(
            {
                "qps": qps,
                "real_run": str(tmp_path / config_id / "real_bench" / f"search-{qps:g}"),
                "disturbed": False,
            }
        )
    points = tuple(
        Point(qps, "real", {"ttft_p90": 90.0 if meets else 130.0, "tpot_p90": 20.0}, meets)
        for qps, meets in rates.items()
    )
    met = max(q for q, m in rates.items() if m)
    above = min((q for q, m in rates.items() if not m), default=None)
    return RealSearch(Answer(met, (met, above), points), runs, wall_s=60.0)


def _answer(qps: float) -> Answer:
    point = Point(qps, "grid", {"ttft_p90": 95.0, "tpot_p90": 18.0}, True)
    return Answer(qps, (qps, qps * 1.05), (point,))


def test_an_adopted_calibration_builds_the_checked_rows_again_and_keeps_the_first(
    tmp_path: Path,
) -> None:
    """Each checked row rebuilt from its real search with the second calibration's simulation
    (its capacity, the ratio, the server's level over the same judged runs: the disturbed
    re-runs never read), the first's capacity and level kept, the rows in the new order."""
    cfg = TuneStageConfig(
        hardware=CPU, capacity=CapacityOptions(slo=SloConfig(ttft_ms=100.0, tpot_ms=30.0))
    )
    steps = pd.read_csv(DATA / "engine_schedule.csv")
    predict = fitted_model(steps)
    searches = {
        "s32-t128": _search(tmp_path, "s32-t128", {54.0: True, 62.0: False}, 1.0),
        "s2-t32": _search(tmp_path, "s2-t32", {9.4: True, 10.8: False}, 1.1),
    }
    first = {"s32-t128": 45.0, "s2-t32": 5.6}
    verified: dict[str, Any] = {
        "configs": [
            {"config_id": c, "simulated_qps": q, "server_step_level": {"ratio": 0.88}}
            for c, q in first.items()
        ]
    }
    second = [sim("s2-t32", 9.9, 50.0), sim("s32-t128", 55.0, 40.0)]
    second = [dataclasses.replace(s, answer=_answer(s.capacity or 0.0)) for s in second]
    again = Recalibrated(record={}, results=second)
    simulated_at: list[tuple[str, list[float]]] = []
    scaled: list[tuple[str, float]] = []

    def simulate_at(s: Any, rates: list[float]) -> tuple[Point, ...]:
        simulated_at.append((s.candidate.config_id, rates))
        return tuple(
            Point(q, "real-rate", {"ttft_p90": 99.0, "tpot_p90": 18.0}, True) for q in rates
        )

    def at_level(s: Any, scale: float) -> Any:
        scaled.append((s.candidate.config_id, round(scale, 2)))
        return dataclasses.replace(s, answer=_answer(round(s.capacity / scale, 2)))

    adopt_rows(cfg, verified, again, searches, simulate_at, lambda s: (predict, None), at_level)
    rows = {row["config_id"]: row for row in verified["configs"]}
    assert [row["config_id"] for row in verified["configs"]] == ["s32-t128", "s2-t32"]
    s2 = rows["s2-t32"]
    assert s2["first_calibration_qps"] == 5.6 and s2["simulated_qps"] == 9.9
    assert s2["first_calibration_step_level"] == {"ratio": 0.88}
    assert s2["measured_qps"] == 9.4 and s2["measured_bracket_qps"] == [9.4, 10.8]
    assert s2["ratio"] == pytest.approx(9.9 / 9.4, abs=1e-4) and s2["simulated_in_bracket"]
    # the level over the judged runs only (1.1x the record; the 3x re-runs are not read)
    level = s2["server_step_level"]
    assert level is not None and len(level["per_run"]) == 2
    assert level["ratio"] == pytest.approx(
        1.1 * rows["s32-t128"]["server_step_level"]["ratio"], rel=0.01
    )
    assert s2["simulated_at_server_level_qps"] == pytest.approx(9.9 / level["ratio"], abs=0.02)
    assert level["front_end"] is True  # the engine on the host's CPU: its front end scaled too
    assert sorted(c for c, _ in simulated_at) == ["s2-t32", "s32-t128"]
    assert dict(simulated_at)["s2-t32"] == [9.4, 10.8]  # the real rates, each simulated again
    assert s2["latency_agreement"]["rates"] == [9.4, 10.8]
    # the record the stage computes again from the rebuilt rows
    verified.update(summary(verified["configs"], cfg, 300.0))
    assert verified["simulated_best"] == "s32-t128" and verified["measured_best_in_sim_top2"]
    speed = verified["calibration_speed"]
    assert speed is not None and speed["servers"] == 2
    table = "\n".join(verify_markdown({**verified, "spearman": None}))
    assert "first calibration (req/s)" in table and "| 5.6 |" in table


def test_the_sentence_says_both_levels_and_what_was_kept() -> None:
    record = {
        "first": {"pooled_level": 1.1749},
        "second": {"pooled_level": 1.012},
        "adopted": True,
        "bundle": "tmp/tune/x/recalibration/profiles",
        "wall_time_s": 231.4,
    }
    said = recalibration_sentence(record)
    assert "1.175 against the first calibration, 1.012 against the second" in said
    assert "adopted" in said and "231.4 s" in said
    kept = recalibration_sentence({**record, "second": None, "adopted": False})
    assert "none against the second" in kept and "kept the first" in kept


def test_a_second_calibration_that_fails_keeps_the_first_and_says_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from gpu_simulate_test.tune import recalibrate as module

    def fails(*args: Any) -> Any:
        raise RuntimeError("the vLLM server exited before it was ready (exit code 1)")

    monkeypatch.setattr(module, "second_calibration", fails)
    cfg = TuneStageConfig(progress=False)
    verified = {"configs": [], "calibration_speed": {"pooled_level": 1.111, "note": "ran"}}
    unused: Any = None  # what the failing second calibration never reads
    kept = module.recalibrate(cfg, unused, unused, unused, [], [], verified, {}, "ran")
    assert kept.results is None and kept.tuned is None  # the first calibration's answer stands
    record = kept.record
    assert not record["adopted"] and record["first"]["pooled_level"] == 1.111
    assert (
        record["error"] == "RuntimeError: the vLLM server exited before it was ready (exit code 1)"
    )
    said = recalibration_sentence(record)
    assert (
        said.startswith("calibrating again failed") and "first calibration's answer is kept" in said
    )


def test_the_capacity_is_simulated_again_at_the_level_of_the_rates_that_decided_it(
    tmp_path: Path,
) -> None:
    steps = pd.read_csv(DATA / "engine_schedule.csv")
    predict = fitted_model(steps)
    found = _search(tmp_path, "s8-t32", {16.3: True, 21.14: True, 23.05: False}, 1.0)
    for qps in (21.14, 23.05):  # the server slowed down where it was judged
        where = tmp_path / "s8-t32" / "real_bench" / f"search-{qps:g}" / "engine_schedule.csv"
        slower(steps, 1.25).to_csv(where, index=False)
    level = server_level((predict, None), found)
    assert level is not None
    first, *bracket = level["per_run"]
    assert bracket[0] == pytest.approx(1.25 * first, rel=0.01) and bracket[0] == bracket[1]
    judged = level["judged"]
    assert judged["rates"] == [21.14, 23.05] and judged["ratio"] == pytest.approx(bracket[0])
    assert first < level["ratio"] < judged["ratio"]  # the whole search's sits between
    assert judged_level(level) == judged["ratio"]
    assert judged_level({"ratio": 1.1, "judged": None}) == 1.1


@pytest.mark.parametrize(("device", "front"), [("cpu", 1.25), ("cuda", 1.0)])
def test_the_server_level_search_scales_the_front_end_where_the_engine_shares_the_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, device: str, front: float
) -> None:
    """``at_step_level``: every step the server's level times as long, and on the host's CPU
    (whose cores the API server shares) the front end too; on a GPU the front end as
    calibrated; its points apart, under ``points/at-level``."""
    from gpu_simulate_test.config.pipeline import PipelineStageConfig
    from gpu_simulate_test.tune import simulate

    seen: list[Any] = []

    def searched(tuned: Any, candidate: Any, shared: Any, seed: Any, grid: bool) -> Any:
        seen.append(tuned)
        return "again"

    monkeypatch.setattr(simulate, "one_configuration", searched)
    hardware = dataclasses.replace(CPU, device=device)
    inner = PipelineStageConfig(model=TuneStageConfig().model, hardware=hardware)
    tuned = simulate.TuneInputs(
        cfg=TuneStageConfig(hardware=hardware), inner=inner, workload_dir=tmp_path,
        longest_prompt=64, points_dir=tmp_path / "points",
    )  # fmt: skip
    assert simulate.at_step_level(tuned)(sim("s2-t32", 9.9, 50.0), 1.25) == "again"
    vidur = seen[0].inner.vidur
    assert vidur.step_time_scale == 1.25 and vidur.frontend_time_scale == front
    assert seen[0].points_dir == tmp_path / "points" / simulate.AT_LEVEL
