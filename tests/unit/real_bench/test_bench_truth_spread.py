"""The truth-spread benchmark's figures: pairs within the limit and the best single prediction."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from gpu_simulate_test.real_bench.spread import best_prediction, p50s, pairs_within, spread


def test_pairs_count_every_metric_at_once_in_both_directions() -> None:
    runs = np.array([[10.0, 100.0], [10.5, 100.0], [10.0, 130.0]])
    # 0 and 1 agree on both (5% and 4.8%); 2 is 30% off on the second metric
    assert pairs_within(runs, 0.10) == (2, 6)
    assert pairs_within(runs, 0.40) == (6, 6)
    # |a/b - 1| is not symmetric: 11 against 10 is +10%, 10 against 11 is -9.1%
    assert pairs_within(np.array([[10.0], [11.0]]), 0.095) == (1, 2)


def test_the_best_prediction_meets_the_most_runs_it_can() -> None:
    runs = np.array([[10.0, 50.0], [10.4, 51.0], [10.9, 53.0], [20.0, 50.0]])
    met, where = best_prediction(runs, 0.10)
    assert met == 3  # the three around 10 / 50 ms; no prediction also meets 20 ms
    assert np.all(np.abs(np.asarray(where) / runs[:3] - 1.0) <= 0.10 + 1e-9)
    assert best_prediction(runs, 0.02)[0] == 2  # 10.2 / 50.5 ms is within 2% of the first two
    assert best_prediction(runs, 0.01)[0] == 1  # 1%: no two runs are that close on both


def test_spread_of_identical_runs_is_perfect_and_of_scattered_runs_is_not() -> None:
    same = spread(np.array([[12.0, 10.0, 100.0]] * 4), 0.10)
    assert same["pair_fraction"] == 1.0 and same["best_prediction_meets"] == 4
    assert same["cv"] == [0.0, 0.0, 0.0]
    scattered = spread(np.array([[10.0, 10, 10], [13.0, 13, 13], [16.0, 16, 16]]), 0.10)
    assert scattered["pairs_within"] == 0 and scattered["best_prediction_meets"] == 1
    assert scattered["max_over_min"] == [1.6, 1.6, 1.6]
    assert scattered["five_in_a_row"] == 0.0


def test_p50s_read_both_clocks_and_skip_a_missing_engine_clock(tmp_path: Path) -> None:
    summary = {
        "engine_ttft_ms": {"p50": 12.0}, "engine_tpot_ms": {"p50": 10.0},
        "engine_e2e_ms": {"p50": 100.0}, "p50_ttft_ms": 25.0, "p50_tpot_ms": 10.1,
        "p50_e2el_ms": 113.0,
    }  # fmt: skip
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    got = p50s(tmp_path)
    assert got["engine"] == [12.0, 10.0, 100.0]
    assert got["client"] == pytest.approx([25.0, 10.1, 113.0])
    del summary["engine_tpot_ms"]
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    assert "engine" not in p50s(tmp_path)


def test_fresh_profiles_count_the_truths_own_repeat_by_the_same_bound() -> None:
    from gpu_simulate_test.fidelity.bounds import passes

    def run(sim: float, noise: float | None) -> dict[str, object]:
        errors = {f"{m}_p50": sim for m in ("ttft", "tpot", "e2e")}
        repeat = {f"{m}_p50": {"engine": noise, "client": noise} for m in ("ttft", "tpot", "e2e")}
        return {"client_p50": errors, "engine_p50": errors, "real_vs_real_p50": repeat}

    results = [run(0.05, 0.02), run(0.15, 0.03), run(-0.08, -0.12), run(0.01, None)]
    results[3]["real_vs_real_p50"] = {}  # no repeat: not counted for the truth
    assert passes(results) == (3, 2, 3)


def test_campaign_bias_sets_the_repeat_beside_the_simulation(tmp_path: Path) -> None:
    import pandas as pd

    from gpu_simulate_test.fidelity.bounds import campaign_bias, fidelity_table

    table = pd.DataFrame(
        {
            "backend": ["vllm"] * 4 + ["hf_cb"],
            "clock": ["engine", "engine", "client", "client", "engine"],
            "rel_error": [0.10, -0.04, 0.02, 0.04, 0.5],
            "noise": [0.05, None, -0.01, -0.03, None],
        }
    )
    got = campaign_bias(table)
    # both means over the rows the truth was repeated on: the -4% row had no repeat
    assert got["vllm/engine"] == {
        "rows": 1, "sim_mean_signed_pct": 10.0, "repeat_rows": 1, "repeat_mean_signed_pct": 5.0
    }  # fmt: skip
    assert got["vllm/client"]["repeat_mean_signed_pct"] == -2.0
    assert got["vllm/client"]["sim_mean_signed_pct"] == 3.0
    # another backend is its own campaign, not mixed in; without a repeat, every row
    assert got["hf_cb/engine"] == {
        "rows": 1, "sim_mean_signed_pct": 50.0, "repeat_rows": 0, "repeat_mean_signed_pct": None
    }  # fmt: skip
    old = tmp_path / "fidelity.csv"
    table.drop(columns="clock").to_csv(old, index=False)
    with pytest.raises(SystemExit, match="missing columns clock"):
        fidelity_table(old)


def test_the_replayed_workload_is_the_pipelines_own() -> None:
    from gpu_simulate_test.config.presets import pipeline_workload

    overrides = pipeline_workload()
    assert "workload.num_requests=40" in overrides and "workload.qps=4.0" in overrides
    assert "workload.prompt_len.max=128" in overrides  # nested blocks as dotted keys
    assert all(o.startswith("workload.") and "=" in o for o in overrides)
