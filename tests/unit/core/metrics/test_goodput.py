"""Goodput counted as ``vllm bench serve --goodput`` counts it: checked against vLLM's own
``calculate_metrics`` on the same requests, and the goals' config refused when malformed."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_simulate_test.config.capacity import SloConfig
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.core.metrics.goodput import (
    GoodputConfig,
    good_requests,
    goodput,
    table_goodput,
)


def _requests(seed: int = 3, n: int = 200) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    ttft = rng.uniform(0.005, 0.3, n)
    outputs = rng.integers(1, 40, n)
    tpot = rng.uniform(0.002, 0.06, n)
    e2e = ttft + tpot * (outputs - 1)
    ok = rng.random(n) > 0.05
    return {"ttft": ttft, "outputs": outputs, "e2e": e2e, "ok": ok}


@pytest.mark.parametrize(
    "goals",
    [
        {"ttft": 100.0},
        {"tpot": 30.0},
        {"e2el": 800.0},
        {"ttft": 150.0, "tpot": 25.0, "e2el": 1000.0},
    ],
)
def test_goodput_is_vllms(goals: dict[str, float]) -> None:
    serve = pytest.importorskip("vllm.benchmarks.serve")
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    reqs = _requests()
    outputs = [
        RequestFuncOutput(
            success=bool(ok), latency=float(e2e), output_tokens=int(n), ttft=float(ttft),
            prompt_len=16,
        )
        for ttft, e2e, n, ok in zip(
            reqs["ttft"], reqs["e2e"], reqs["outputs"], reqs["ok"], strict=True
        )
    ]  # fmt: skip
    duration = 12.5
    metrics, _ = serve.calculate_metrics([], outputs, duration, None, [50.0], goals)
    ok = reqs["ok"]
    # ours: failed requests have no times; TPOT is NaN for one output token (vLLM counts 0)
    ttft = np.where(ok, reqs["ttft"], np.nan)
    e2e = np.where(ok, reqs["e2e"], np.nan)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(reqs["outputs"] > 1, (e2e - ttft) / (reqs["outputs"] - 1), np.nan)
    ours = goodput(GoodputConfig(**goals), ttft, tpot, e2e, duration)
    assert ours is not None
    assert ours["request_goodput"] == pytest.approx(metrics.request_goodput, rel=1e-12)
    assert 0 < ours["good_requests"] < ok.sum()


def test_a_goal_met_exactly_is_met_and_failed_requests_never_are() -> None:
    good = good_requests({"ttft": 100.0}, [0.1, 0.1000001, np.nan], [0.0, 0.0, 0.0], [1, 1, 1])
    assert good.tolist() == [True, False, False]


def test_no_goals_no_goodput() -> None:
    assert goodput(GoodputConfig(), [0.1], [0.01], [0.5], 1.0) is None


def test_a_table_spans_first_arrival_to_last_token() -> None:
    table = {
        "arrival_time_s": np.array([1.0, 2.0, 3.0]),
        "ttft_s": np.array([0.05, 0.2, 0.05]),
        "tpot_s": np.array([0.01, 0.01, np.nan]),
        "e2e_s": np.array([0.5, 0.6, 1.0]),
    }
    good = table_goodput(table, GoodputConfig(ttft=100))
    assert good == {"goals_ms": {"ttft": 100.0}, "good_requests": 2, "request_goodput": 2 / 3.0}


def test_bad_goals_are_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"goodput\.tpot=-1"):
        GoodputConfig(tpot=-1)
    assert SloConfig(ttft_ms=100, tpot_ms=0).goodput_goals() == GoodputConfig(ttft=100)
