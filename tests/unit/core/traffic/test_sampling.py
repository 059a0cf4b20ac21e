"""Length and arrival samplers: bounds, rates, burstiness and determinism."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_simulate_test.config.schema import LENGTH_KINDS, ArrivalConfig, LengthDistConfig
from gpu_simulate_test.core.traffic.sampling import rescale_to_qps, sample_arrivals, sample_lengths


@pytest.mark.parametrize("kind", ["fixed", "uniform", "normal", "zipf", "lognormal"])
def test_lengths_are_integers_within_bounds(kind: str) -> None:
    cfg = LengthDistConfig(kind=kind, value=50, min=10, max=100, mean=50, std=40, sigma=1.0)
    lengths = sample_lengths(cfg, 5000, np.random.default_rng(0))
    assert lengths.dtype == np.int64 and len(lengths) == 5000
    assert lengths.min() >= 10 and lengths.max() <= 100
    if kind == "fixed":
        assert set(lengths.tolist()) == {50}


def test_length_distributions_have_their_shape() -> None:
    rng = np.random.default_rng(1)
    normal = sample_lengths(
        LengthDistConfig(kind="normal", mean=500, std=50, min=1, max=10_000), 20_000, rng
    )
    assert abs(normal.mean() - 500) < 3 and abs(normal.std() - 50) < 3
    logn = sample_lengths(
        LengthDistConfig(kind="lognormal", mean=200, sigma=0.5, min=1, max=100_000), 20_000, rng
    )
    assert abs(np.median(logn) - 200) < 8
    zipf = sample_lengths(LengthDistConfig(kind="zipf", zipf_a=2.0, min=5, max=1000), 20_000, rng)
    assert np.bincount(zipf).argmax() == 5  # the mode is min
    uniform = sample_lengths(LengthDistConfig(kind="uniform", min=1, max=4), 20_000, rng)
    assert set(uniform.tolist()) == {1, 2, 3, 4}


def test_poisson_arrivals_have_the_requested_rate() -> None:
    arrivals = sample_arrivals(
        ArrivalConfig(process="poisson"), 20_001, 4.0, np.random.default_rng(2)
    )
    assert arrivals[0] == 0 and np.all(np.diff(arrivals) >= 0)
    gaps = np.diff(arrivals)
    assert abs(gaps.mean() - 0.25) < 0.01
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # exponential: coefficient of variation 1


def test_gamma_burstiness_changes_variability_not_rate() -> None:
    rng = np.random.default_rng(3)
    bursty = np.diff(
        sample_arrivals(ArrivalConfig(process="gamma", burstiness=0.25), 20_001, 2.0, rng)
    )
    smooth = np.diff(
        sample_arrivals(ArrivalConfig(process="gamma", burstiness=4.0), 20_001, 2.0, rng)
    )
    assert abs(bursty.mean() - 0.5) < 0.03 and abs(smooth.mean() - 0.5) < 0.03
    # gamma with shape k has coefficient of variation 1/sqrt(k)
    assert abs(bursty.std() / bursty.mean() - 2.0) < 0.15
    assert abs(smooth.std() / smooth.mean() - 0.5) < 0.05


def test_fixed_and_all_at_once() -> None:
    fixed = sample_arrivals(ArrivalConfig(process="fixed"), 5, 2.0, np.random.default_rng(0))
    assert fixed.tolist() == [0.0, 0.5, 1.0, 1.5, 2.0]
    burst = sample_arrivals(ArrivalConfig(process="all_at_once"), 3, 2.0, np.random.default_rng(0))
    assert burst.tolist() == [0.0, 0.0, 0.0]
    inf_rate = sample_arrivals(
        ArrivalConfig(process="poisson"), 3, float("inf"), np.random.default_rng(0)
    )
    assert inf_rate.tolist() == [0.0, 0.0, 0.0]


def test_same_seed_same_samples_other_seed_other_samples() -> None:
    cfg = LengthDistConfig(kind="uniform", min=1, max=1000)
    a = sample_lengths(cfg, 100, np.random.default_rng(7))
    b = sample_lengths(cfg, 100, np.random.default_rng(7))
    c = sample_lengths(cfg, 100, np.random.default_rng(8))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_rescale_to_qps() -> None:
    arrivals = np.array([10.0, 11.0, 12.0, 14.0])  # 3 gaps over 4 s: 0.75 req/s
    scaled = rescale_to_qps(arrivals, 3.0)
    assert scaled[0] == 0 and scaled[-1] == pytest.approx(1.0)
    assert (len(scaled) - 1) / scaled[-1] == pytest.approx(3.0)


def test_a_length_records_only_the_fields_its_kind_draws_with() -> None:
    """workload_meta.json's generator: a uniform 4-32 says min and max, not a mean of 128."""
    uniform = LengthDistConfig(kind="uniform", min=4, max=32)
    assert uniform.used() == {"kind": "uniform", "min": 4, "max": 32}
    normal = LengthDistConfig(kind="normal", mean=64.0, std=8.0, min=1, max=256)
    assert normal.used() == {"kind": "normal", "mean": 64.0, "std": 8.0, "min": 1, "max": 256}
    assert LengthDistConfig(kind="fixed", value=7).used()["value"] == 7
    assert set(LengthDistConfig.USED) == set(LENGTH_KINDS)  # every kind says what it draws with
