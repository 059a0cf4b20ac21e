"""The comparison's metric math on hand-built records, against hand-computed values."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.analysis import metrics as m
from gpu_simulate_test.analysis.comparison import compare, discrepancies, join_requests
from gpu_simulate_test.io.artifacts import ArtifactError


def test_distribution_percentiles_and_mean() -> None:
    dist = m.distribution([1.0, 2.0, 3.0, 4.0, float("nan")])  # NaN dropped
    assert dist.count == 4
    # numpy linear interpolation: position q/100 * (n - 1)
    assert dist.p50 == pytest.approx(2.5)
    assert dist.p90 == pytest.approx(3.7)
    assert dist.p95 == pytest.approx(3.85)
    assert dist.p99 == pytest.approx(3.97)
    assert dist.mean == pytest.approx(2.5)
    assert math.isnan(m.distribution([]).p50) and m.distribution([]).count == 0


def test_relative_error_sign_and_absolute() -> None:
    real = m.distribution([0.100, 0.100])
    sim = m.distribution([0.077, 0.077])
    errors = {e.stat: e for e in m.compare_distributions(real, sim)}
    assert errors["p90"].signed_rel_error == pytest.approx(-0.23)  # simulated 23% low
    assert errors["p90"].abs_rel_error == pytest.approx(0.23)
    assert m.relative_error(0.15, 0.10) == pytest.approx(0.5)  # simulated slower: positive
    assert math.isnan(m.relative_error(1.0, 0.0))
    assert math.isnan(m.relative_error(float("nan"), 1.0))


def test_tpot_excludes_single_token_requests() -> None:
    tpot = m.tpot_s(np.array([0.1, 0.2, 0.3]), np.array([0.5, 0.2, 0.9]), np.array([5, 1, 3]))
    assert tpot[0] == pytest.approx(0.1)  # (0.5 - 0.1) / 4
    assert math.isnan(tpot[1])
    assert tpot[2] == pytest.approx(0.3)  # (0.9 - 0.3) / 2
    assert m.distribution(tpot).count == 2


def test_throughput_from_time_zero_to_last_token() -> None:
    tp = m.throughput(
        np.array([0.0, 1.0, 2.0]), np.array([1.0, 3.0, float("nan")]), np.array([10, 20, 30])
    )
    # the third request did not finish: 2 requests, 30 tokens, last token at 1 + 3 = 4 s
    assert (tp.num_requests, tp.output_tokens) == (2, 30)
    assert tp.duration_s == pytest.approx(4.0)
    assert tp.requests_per_s == pytest.approx(0.5)
    assert tp.output_tokens_per_s == pytest.approx(7.5)


def test_per_request_errors_and_summary() -> None:
    err = m.per_request_errors(np.array([1.05, 0.5, 2.0, 1.0]), np.array([1.0, 1.0, 1.0, 0.0]))
    assert err[:3] == pytest.approx([0.05, -0.5, 1.0])
    assert math.isnan(err[3])
    summary = m.error_summary(err)
    assert summary.count == 3
    assert summary.mean == pytest.approx((0.05 - 0.5 + 1.0) / 3)
    assert summary.mean_abs == pytest.approx((0.05 + 0.5 + 1.0) / 3)
    assert summary.within_10pct == pytest.approx(1 / 3)
    assert summary.within_25pct == pytest.approx(1 / 3)


def test_spearman_and_offered_qps() -> None:
    assert m.spearman(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40])) == pytest.approx(1.0)
    assert m.spearman(np.array([1, 2, 3, 4]), np.array([4, 3, 2, 1])) == pytest.approx(-1.0)
    assert math.isnan(m.spearman(np.array([1, 2]), np.array([1, 2])))
    assert m.offered_qps(np.array([0.0, 0.5, 1.0, 2.0])) == pytest.approx(1.5)
    assert m.offered_qps(np.zeros(3)) == math.inf


def _frame(
    ttft: list[float], e2e: list[float], status: list[str], decode: list[int]
) -> pd.DataFrame:
    n = len(ttft)
    return pd.DataFrame(
        {
            "request_id": range(n),
            "arrival_time_s": [float(i) for i in range(n)],
            "num_prefill_tokens": [10 * (i + 1) for i in range(n)],
            "num_decode_tokens": decode,
            "ttft_s": ttft,
            "tpot_s": np.nan,
            "e2e_s": e2e,
            "status": status,
        }
    )


def test_join_excludes_failed_requests_and_compares_the_rest() -> None:
    real = _frame([0.1, 0.2, 0.3], [1.0, 2.0, float("nan")], ["ok", "ok", "error"], [3, 5, 2])
    sim = _frame([0.05, 0.1, 0.1], [0.5, 1.0, 1.0], ["ok", "ok", "ok"], [3, 5, 2])
    joined, excluded = join_requests(real, sim, where="t")
    assert joined.request_id.tolist() == [0, 1]
    assert [(e.request_id, e.real_status, e.sim_status) for e in excluded] == [(2, "error", "ok")]
    result = compare(joined, excluded, np.array([0.4, 0.45]))
    ttft = result.metric("ttft")
    assert ttft.real.p50 == pytest.approx(0.15) and ttft.sim.p50 == pytest.approx(0.075)
    assert {e.stat: e.signed_rel_error for e in ttft.errors}["p50"] == pytest.approx(-0.5)
    assert result.metric("tpot").real.mean == pytest.approx(((1.0 - 0.1) / 2 + (2.0 - 0.2) / 4) / 2)
    assert not result.metric("itl").available_sim and result.metric("itl").real.count == 2
    assert result.throughput_real.output_tokens == 8
    findings = discrepancies(result)
    assert any("TTFT p90 is 2.0x too low" in line for line in findings)
    assert any("1 request(s) not ok on both sides" in line for line in findings)


def test_join_rejects_different_lengths() -> None:
    real = _frame([0.1], [1.0], ["ok"], [3])
    sim = _frame([0.1], [1.0], ["ok"], [4])
    with pytest.raises(ArtifactError, match="request 0 has num_decode_tokens=3 in the real run"):
        join_requests(real, sim, where="t")
