"""The comparison's verdict: each figure judged within max(10%, real vs real) on its own clock,
the largest gap's cause named from what was measured, and a disturbed truth said first."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.comparison import compare
from gpu_simulate_test.compare.verdict import (
    RunState,
    run_state,
    verdict,
    verdict_markdown,
)
from tests.unit.compare.test_compare_clocks import _side


def _comparison(sim_ttft: float = 0.028) -> Any:
    n = 40
    joined = m.JoinedRequests(
        request_id=np.arange(n, dtype=np.int64),
        num_prefill_tokens=np.full(n, 16, dtype=np.int64),
        num_decode_tokens=np.full(n, 8, dtype=np.int64),
        real=_side(0.030, 0.010, 0.100, n),
        sim=_side(sim_ttft, 0.0095, 0.097, n),
    )
    return compare(joined, (), np.full(10, 0.01))


def _row(metric: str, stat: str, **values: float) -> dict[str, Any]:
    base = {
        "metric": metric, "stat": stat, "error_vs_engine": 0.02, "error_vs_client": 0.03,
        "noise_vs_engine": 0.05, "noise_vs_client": 0.04, "front_end_s": 0.010,
        "sim_front_end_s": 0.004,
    }  # fmt: skip
    return {**base, **values}


def _clocks(**ttft_p90: float) -> list[dict[str, Any]]:
    return [
        _row(metric, stat, **(ttft_p90 if (metric, stat) == ("ttft", "p90") else {}))
        for metric in ("ttft", "tpot", "e2e")
        for stat in ("p50", "p90", "p99")
    ]


CALM = [RunState("real run", "main", False, ()), RunState("repeat", "main-r2", False, ())]
STEPS = {"step_time_error": -0.09, "step_count_error": 0.04, "real": {"steps": 586},
         "sim": {"steps": 612}}  # fmt: skip


def test_a_client_gap_with_the_engine_within_is_the_front_end() -> None:
    # the main job's shape (2026-12-01): client TTFT p90 -31.5% against real vs real +0.9%
    clocks = _clocks(error_vs_client=-0.315, noise_vs_client=0.009, front_end_s=0.0257,
                     sim_front_end_s=0.0083)  # fmt: skip
    record = verdict(_comparison(), clocks, STEPS, CALM)
    assert (record["within"], record["judged"]) == (11, 12)
    assert record["outside"] == ["client TTFT p90 -31.5% (real vs real +0.9%)"]
    assert "the front end (client − engine): 25.7 ms real against 8.3 ms" in record["cause"]
    lines = verdict_markdown(record)
    assert lines[0].startswith("- **Verdict:** 11 of 12 figures within max(10%, real vs real)")
    assert lines[0].endswith(
        "Outside, furthest first: client TTFT p90 -31.5% (real vs real +0.9%)."
    )
    assert lines[1].startswith("- **Largest gap:** client TTFT p90 -31.5%")
    assert lines[2] == "- **Truth:** the real run and the repeat undisturbed."
    assert len(lines) <= 5  # the first 10 lines of summary.md hold the verdict


def test_a_client_gap_mostly_the_engine_s_is_not_blamed_on_the_front_end() -> None:
    """``make run``'s fidelity load (2026-12-07): client TPOT p90 -6.6%, the engine's clock
    -6.1% (within), the front end -0.1 ms real against -0.2 ms simulated: the engine's steps."""
    clocks = _clocks(error_vs_client=-0.315, noise_vs_client=0.009, front_end_s=-0.0001,
                     sim_front_end_s=-0.0002, engine_s=0.0203, sim_engine_s=0.0190)  # fmt: skip
    record = verdict(_comparison(), clocks, STEPS, CALM)
    assert record["largest_gap"].startswith("client TTFT p90 -31.5%")
    assert record["cause"].startswith("the engine's step time: simulated steps -9.0%")
    # the same front end with the engine's gap smaller than its own: the front end
    clocks = _clocks(error_vs_client=-0.315, noise_vs_client=0.009, front_end_s=0.0257,
                     sim_front_end_s=0.0083, engine_s=0.0203, sim_engine_s=0.0190)  # fmt: skip
    assert verdict(_comparison(), clocks, STEPS, CALM)["cause"].startswith("the front end")


def test_the_pooled_seeds_are_said_beside_the_verdict_and_never_change_it() -> None:
    """Client TTFT p90 -18% on the main seed (outside +4%), -6% with every seed's requests
    pooled: the verdict stays 11 of 12, the line beside it says 12 of 12 over 3 seeds."""
    clocks = _clocks(error_vs_client=-0.18)
    for row in clocks:
        row.update(seeds_sim_s=[0.01, 0.01], pooled_vs_engine=0.02, pooled_vs_client=0.03)
    clocks[1]["pooled_vs_client"] = -0.06  # TTFT p90
    record = verdict(_comparison(), clocks, STEPS, CALM)
    assert (record["within"], record["judged"]) == (11, 12)
    assert record["pooled"] == {"seeds": 3, "within": 12, "judged": 12}
    lines = verdict_markdown(record)
    assert lines[2] == (
        "- **Over its 3 seeds:** every seed's requests pooled, 12 of 12 figures within the same "
        "bands (reported, not judged)."
    )
    assert lines[3].startswith("- **Truth:**") and len(lines) <= 6
    # without the seeds, no such line and no pooled record
    plain = verdict(_comparison(), _clocks(error_vs_client=-0.18), STEPS, CALM)
    assert plain["pooled"] is None and not any("seeds" in line for line in verdict_markdown(plain))


def test_the_truth_s_own_spread_widens_the_band_and_p99_is_not_judged() -> None:
    # -18% on the engine's clock where the truth's repeat moved -19%: within its noise
    clocks = _clocks(error_vs_engine=-0.18, noise_vs_engine=-0.19)
    clocks[2]["error_vs_engine"] = -0.60  # TTFT p99: one request of 40, left to the tables
    record = verdict(_comparison(), clocks, STEPS, CALM)
    assert record["within"] == record["judged"] == 12 and record["outside"] == []
    assert verdict_markdown(record)[0].endswith(": every one.")
    # the same error against a calm truth (+5%) is outside, and an engine gap is the steps'
    clocks = _clocks(error_vs_engine=-0.18, error_vs_client=-0.17)
    record = verdict(_comparison(), clocks, STEPS, CALM)
    assert record["largest_gap"] == "engine TTFT p90 -18.0% (real vs real +5.0%)"
    assert record["cause"].startswith("the engine's step time: simulated steps -9.0%")
    more_steps = {**STEPS, "step_count_error": 0.2}
    assert (
        "612 simulated steps against 586 real (+20.0%"
        in verdict(_comparison(), clocks, more_steps, CALM)["cause"]
    )


def test_without_an_engine_clock_the_client_is_judged_against_ten_percent() -> None:
    record = verdict(_comparison(sim_ttft=0.024), None, None, CALM[:1])
    assert record["judged"] == 6 and not record["repeat"]  # TTFT, TPOT, E2E at p50 and p90
    assert record["outside"] == [
        "client TTFT p50 -20.0% (no repeat)", "client TTFT p90 -20.0% (no repeat)",
    ]  # fmt: skip
    # many outside: the line names the 3 furthest, the record keeps them all
    clocks = [
        _row(metric, stat, error_vs_engine=-0.3, error_vs_client=-0.5 if metric == "e2e" else -0.2)
        for metric in ("ttft", "tpot", "e2e")
        for stat in ("p50", "p90")
    ]
    far = verdict(_comparison(), clocks, None, CALM)
    assert len(far["outside"]) == 12 and far["outside"][0].startswith("client E2E")
    assert verdict_markdown(far)[0].endswith("; and 9 more.")
    assert "no engine step record" in record["cause"]
    assert "10% (no repeat of the truth)" in verdict_markdown(record)[0]


def test_a_disturbed_truth_is_said_first_with_its_reasons(tmp_path: Path) -> None:
    def real_run(name: str, disturbed: bool, reasons: list[str]) -> Path:
        path = tmp_path / name
        path.mkdir()
        record = {"disturbance": {"disturbed": disturbed, "reasons": reasons}}
        (path / "run_meta.json").write_text(json.dumps(record))
        return path

    kept = real_run("main-r2-rerun1", True, ["late_sends: 3 late sends, over the limit 2"])
    runs = [run_state("real run", real_run("main-rerun1", False, [])),
            run_state("repeat", kept)]  # fmt: skip
    replaced = [run_state("replaced", real_run("main", True, ["foreign_cpu: 0.4 cores"]))]
    record = verdict(_comparison(), _clocks(), STEPS, runs, replaced)
    assert record["disturbed"] == ["main-r2-rerun1"]
    truth = verdict_markdown(record)[2]
    assert truth.startswith("- **Truth: DISTURBED**, judged anyway and marked: the repeat")
    assert "late_sends: 3 late sends, over the limit 2" in truth
    assert "1 disturbed run(s) replaced by a re-run (`main`)" in truth
    # a run without a verdict (an imported or older run) is not judged disturbed
    assert run_state("real run", tmp_path / "nowhere") == RunState("real run", "nowhere", False, ())
    assert record["figures"][0]["band"] == pytest.approx(0.10)


def test_an_imported_truth_nobody_judged_is_not_said_undisturbed(tmp_path: Path) -> None:
    """A run bench_import wrote records no signs of disturbance: the verdict read "the real run
    undisturbed" for a run nothing had checked."""
    imported = tmp_path / "vllm-load1"
    imported.mkdir()
    note = "not judged: imported from guidellm, which records no such signs"
    record = {"disturbance": {"disturbed": False, "reasons": [], "note": note}}
    (imported / "run_meta.json").write_text(json.dumps(record))
    state = run_state("real run", imported)
    assert state.unjudged == "imported from guidellm, which records no such signs"
    truth = verdict_markdown(verdict(_comparison(), _clocks(), STEPS, [state], []))[2]
    assert truth == (
        "- **Truth:** not judged for disturbance (the real run: imported from guidellm, which "
        "records no such signs)."
    )
    beside = [state, CALM[1]]  # a repeat of our own, judged
    truth = verdict_markdown(verdict(_comparison(), _clocks(), STEPS, beside, []))[2]
    assert truth.endswith("which records no such signs) (the repeat undisturbed).")
