"""Pure samplers for token lengths and arrival times (deterministic for a given generator)."""

from __future__ import annotations

import math

import numpy as np

from gpu_simulate_test.config.schema import ArrivalConfig, DurationDistConfig, LengthDistConfig


def sample_lengths(cfg: LengthDistConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` token lengths (int64), rounded and clipped to ``[cfg.min, cfg.max]``."""
    if cfg.kind == "fixed":
        raw = np.full(n, float(cfg.value))
    elif cfg.kind == "uniform":
        raw = rng.integers(cfg.min, cfg.max + 1, size=n).astype(float)
    elif cfg.kind == "normal":
        raw = rng.normal(cfg.mean, cfg.std, size=n)
    elif cfg.kind == "zipf":
        # numpy's zipf starts at 1; shift so that the most likely length is cfg.min.
        raw = rng.zipf(cfg.zipf_a, size=n).astype(float) + (cfg.min - 1)
    elif cfg.kind == "lognormal":
        raw = np.exp(rng.normal(math.log(cfg.mean), cfg.sigma, size=n))
    else:  # pragma: no cover - the config rejects other kinds
        raise ValueError(f"unknown length distribution {cfg.kind!r}")
    return np.clip(np.rint(raw), cfg.min, cfg.max).astype(np.int64)


def sample_durations(cfg: DurationDistConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """Draw ``n`` durations in seconds (float64), clipped to ``[cfg.min_s, cfg.max_s]`` and
    rounded to the microsecond (the resolution of a workload's fingerprint)."""
    if cfg.kind == "fixed":
        raw = np.full(n, float(cfg.value_s))
    elif cfg.kind == "uniform":
        raw = rng.uniform(cfg.min_s, cfg.max_s, size=n)
    elif cfg.kind == "exponential":
        raw = rng.exponential(cfg.mean_s, size=n)
    elif cfg.kind == "lognormal":
        raw = np.exp(rng.normal(math.log(cfg.mean_s), cfg.sigma, size=n))
    else:  # pragma: no cover - the config rejects other kinds
        raise ValueError(f"unknown duration distribution {cfg.kind!r}")
    return np.round(np.clip(raw, cfg.min_s, cfg.max_s), 6)


def sample_arrivals(cfg: ArrivalConfig, n: int, qps: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times in seconds (float64, first at 0, non-decreasing) for ``n`` requests.

    As in ``vllm bench serve``: gaps are gamma-distributed with shape ``burstiness`` and mean
    ``1/qps`` (burstiness 1 is Poisson); ``qps=inf`` or ``all_at_once`` sends everything at 0.
    """
    if n == 0:
        return np.zeros(0)
    if cfg.process == "all_at_once" or math.isinf(qps):
        return np.zeros(n)
    if cfg.process == "fixed":
        gaps = np.full(n - 1, 1.0 / qps)
    else:
        shape = 1.0 if cfg.process == "poisson" else cfg.burstiness
        gaps = rng.gamma(shape, 1.0 / (qps * shape), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def rescale_to_qps(arrivals: np.ndarray, target_qps: float) -> np.ndarray:
    """Shift arrivals to start at 0 and stretch time so the mean rate is ``target_qps``."""
    shifted = arrivals - arrivals[0]
    span = float(shifted[-1]) if len(shifted) else 0.0
    if len(shifted) < 2 or span <= 0:
        return shifted
    observed_qps = (len(shifted) - 1) / span
    return shifted * (observed_qps / target_qps)
