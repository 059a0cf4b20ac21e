"""The simulation at the real run's own step level beside the one as calibrated: per figure its
error on both clocks, what the verdict says of it (reported, never judged) and the summary's
section."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from gpu_simulate_test.compare.at_level import (
    AtLevelRun,
    at_level_json,
    at_level_markdown,
    with_at_level,
)
from gpu_simulate_test.compare.clocks import clock_rows
from gpu_simulate_test.compare.seeds import SeedRun
from gpu_simulate_test.compare.verdict import verdict, verdict_markdown
from gpu_simulate_test.config.compare import CompareStageConfig
from gpu_simulate_test.config.schema import ConfigError
from tests.unit.compare.test_compare_seeds import _joined, _real


def _at_level(sim_ttft: float, frontend_s: float, ratio: float | None) -> AtLevelRun:
    requests = pd.DataFrame({"request_id": range(4), "frontend_delay_s": [frontend_s] * 4})
    return AtLevelRun(SeedRun(Path("run-at-level"), 42, requests, _joined(sim_ttft)), ratio)


def _rows() -> list[dict[str, object]]:
    main_sim = pd.DataFrame({"request_id": range(4), "frontend_delay_s": [0.004] * 4})
    rows = clock_rows(_real(), _joined(0.024), main_sim)  # engine 20 ms, client 30 ms
    assert rows is not None
    return rows


def test_the_level_s_errors_sit_beside_the_answer_on_both_clocks() -> None:
    # at the level the client reads 33 ms (+10%) and the engine 33 - 6 = 27 ms (+35%)
    rows = with_at_level(_rows(), _at_level(0.033, 0.006, 1.08))
    assert rows is not None
    ttft = next(r for r in rows if r["metric"] == "ttft" and r["stat"] == "p90")
    assert ttft["at_level_sim_s"] == pytest.approx(0.033)
    assert ttft["at_level_sim_engine_s"] == pytest.approx(0.027)
    assert ttft["at_level_vs_client"] == pytest.approx(0.033 / 0.030 - 1)
    assert ttft["at_level_vs_engine"] == pytest.approx(0.027 / 0.020 - 1)
    assert ttft["error_vs_client"] == pytest.approx(0.024 / 0.030 - 1)  # the answer unmoved
    text = at_level_markdown(rows, _at_level(0.033, 0.006, 1.08))
    assert "## At the real run's step level (a diagnosis)" in text
    assert "(the real steps 1.080× the model's)" in text and "`run-at-level`" in text
    assert "| TTFT | p90 | +0.0% | +35.0% | n/a | -20.0% | +10.0% | n/a |" in text


def test_a_front_end_scaled_with_the_steps_is_said() -> None:
    """On the host's CPU the level's simulation scales the front end too: the summary and
    ``comparison.json`` say by how much; without it, the steps alone."""
    base = _at_level(0.033, 0.006, 1.08)
    scaled = AtLevelRun(base.run, 1.08, 1.08)
    text = at_level_markdown(with_at_level(_rows(), scaled), scaled)
    assert "(the real steps 1.080× the model's, the front end 1.080× too)" in text
    assert "`vidur.frontend_time_scale`" in text
    record = at_level_json(scaled)
    assert record is not None and record["frontend_time_scale"] == 1.08
    plain = at_level_json(base)
    assert plain is not None and plain["frontend_time_scale"] == 1.0
    unscaled = at_level_markdown(with_at_level(_rows(), base), base)
    assert "(the real steps 1.080× the model's)" in unscaled and "front end 1" not in unscaled


def test_without_the_run_the_rows_and_the_summary_are_as_before() -> None:
    rows = _rows()
    assert with_at_level(rows, None) is rows
    assert with_at_level(None, _at_level(0.033, 0.0, 1.0)) is None
    assert at_level_markdown(rows, None) == ""
    assert at_level_markdown(rows, _at_level(0.033, 0.0, 1.0)) == ""  # rows without its columns
    assert at_level_json(None) is None
    record = at_level_json(_at_level(0.033, 0.0, None))
    assert record is not None and record["ratio"] is None
    assert record["sim_run_dir"] == "run-at-level" and "never the answer" in record["convention"]


def test_the_verdict_reports_the_level_s_count_but_judges_the_answer() -> None:
    from tests.unit.compare.test_verdict import CALM, STEPS, _clocks, _comparison

    # the answer misses client TTFT p90 (-31.5% against real vs real +0.9%); at the level every
    # figure is within 2%
    plain = _clocks(error_vs_client=-0.315, noise_vs_client=0.009)
    rows = [{**r, "at_level_vs_engine": 0.01, "at_level_vs_client": -0.02} for r in plain]
    record = verdict(_comparison(), rows, STEPS, CALM, (), 0.95)
    alone = verdict(_comparison(), plain, STEPS, CALM)
    assert alone["at_level"] is None
    assert {k: v for k, v in record.items() if k != "at_level"} == {
        k: v for k, v in alone.items() if k != "at_level"
    }  # the verdict is the answer's, whatever the level says
    assert record["within"] == 11 and record["judged"] == 12
    assert record["at_level"]["ratio"] == 0.95
    assert record["at_level"]["within"] == 12 and record["at_level"]["judged"] == 12
    lines = verdict_markdown(record)
    assert lines[0].startswith("- **Verdict:** 11 of 12")
    assert (
        "- **At the real run's step level** (the real steps 0.950× the model's; a diagnosis, not "
        "judged): 12 of 12 figures within the same bands." in lines
    )
    assert not any("step level" in line for line in verdict_markdown(alone))
    unknown = verdict(_comparison(), rows, STEPS, CALM)  # a level run whose ratio is not said
    assert "(a diagnosis, not judged): 12 of 12" in "".join(verdict_markdown(unknown))


def test_a_sweep_refuses_a_level_run() -> None:
    with pytest.raises(ConfigError, match="at_level_dir= optional"):
        CompareStageConfig(sweep_dirs=("tmp/compare/q-*",), at_level_dir="tmp/vidur_simulate/x")
