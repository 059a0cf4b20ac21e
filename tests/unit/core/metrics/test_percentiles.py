"""The one percentile routine and list (:mod:`gpu_simulate_test.core.metrics.percentiles`), and
every stage's summary built on it: numpy's linear interpolation, NaN for an empty sample everywhere,
no private percentile math or list left in a stage, and the stored keys unchanged."""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pytest

import gpu_simulate_test
from gpu_simulate_test.capacity.contract import CAPACITY_TABLE
from gpu_simulate_test.compare import metrics as compare_metrics
from gpu_simulate_test.compare import steps as compare_steps
from gpu_simulate_test.config.capacity import SLO_PERCENTILES
from gpu_simulate_test.core.engines.records import RequestRecord
from gpu_simulate_test.core.metrics import percentiles as pct
from gpu_simulate_test.core.traffic import workloads
from gpu_simulate_test.fidelity import tables as fidelity_tables
from gpu_simulate_test.real_bench import metrics as real_metrics
from gpu_simulate_test.vidur_simulate import metrics as vidur_metrics

PACKAGE = Path(gpu_simulate_test.__file__).parent
STAGE_MODULES = (
    "capacity/report.py",
    "capacity/stage.py",
    "compare/metrics.py",
    "compare/steps.py",
    "core/metrics/latency.py",
    "core/metrics/summary.py",
    "core/traffic/workloads.py",
    "fidelity/tables.py",
    "real_bench/metrics.py",
    "vidur_simulate/metrics.py",
)
"""Every module whose summaries must come from the one routine."""


# --- the routine -------------------------------------------------------------------------------


def test_percentiles_are_numpys_linear_interpolation() -> None:
    rng = np.random.default_rng(7)
    sample = rng.lognormal(size=1001)
    noisy = np.concatenate([sample, [np.nan, np.inf, -np.inf]])  # left out
    summary = pct.describe(noisy)
    assert summary.count == sample.size
    for q in pct.PERCENTILES:
        assert summary.stat(f"p{q}") == np.percentile(sample, q, method="linear")
    assert summary.median == np.percentile(sample, 50)
    assert summary.mean == pytest.approx(sample.mean(), rel=1e-12)
    assert summary.std == pytest.approx(sample.std(), rel=1e-12)  # ddof 0, as vllm bench serve
    assert (summary.min, summary.max) == (sample.min(), sample.max())
    # by hand: position q/100 * (n - 1) between the sorted values
    small = pct.describe([4.0, 1.0, 3.0, 2.0])
    assert small.stats(["p10", "p50", "p90", "p95", "p99"]) == pytest.approx(
        {"p10": 1.3, "p50": 2.5, "p90": 3.7, "p95": 3.85, "p99": 3.97}
    )
    # scale applies to the values first (seconds to ms)
    assert pct.describe([0.001, 0.003], scale=1e3).stats(["mean", "p50"]) == pytest.approx(
        {"mean": 2.0, "p50": 2.0}
    )


@pytest.mark.parametrize("values", [[], [np.nan], [np.inf, -np.inf, np.nan], np.empty((0,))])
def test_an_empty_sample_is_nan_everywhere(values: npt.ArrayLike) -> None:
    summary = pct.describe(values)
    assert summary.count == 0
    for stat in pct.STAT_NAMES:
        assert _is_nan(summary.stat(stat)), stat


def test_a_table_can_only_select_from_the_one_list() -> None:
    assert pct.select(50, 99) == (50, 99)
    assert pct.names(pct.LATENCY_PERCENTILES) == ("p50", "p90", "p95", "p99")
    with pytest.raises(ValueError, match="75 not in the one list"):
        pct.select(50, 75)
    with pytest.raises(ValueError, match="not in the one list"):
        pct.name(75)
    with pytest.raises(KeyError, match="unknown statistic 'p75'"):
        pct.describe([1.0]).stat("p75")


def test_a_latency_goal_names_a_percentile_the_tables_show() -> None:
    # config imports nothing above it, so it keeps the list by value; the two must not drift
    assert SLO_PERCENTILES == pct.LATENCY_PERCENTILES


# --- the stages --------------------------------------------------------------------------------


def _record(rid: int, arrival: float, times: list[float]) -> RequestRecord:
    return RequestRecord(
        request_id=rid,
        num_prefill_tokens=10,
        expected_decode_tokens=len(times),
        scheduled_arrival_s=arrival,
        arrival_s=arrival,
        event_times_s=times,
        event_num_tokens=[1] * len(times),
        status="ok",
    )


def _requests(ok: bool) -> pd.DataFrame:
    """A request_metrics-like table; ``ok=False``: every request failed (nothing to summarize)."""
    return pd.DataFrame(
        {
            "status": ["ok" if ok else "error"] * 3,
            "ttft_s": [0.010, 0.020, 0.030],
            "tpot_s": [0.001, 0.002, 0.003],
            "e2e_s": [0.1, 0.2, 0.3],
        }
    )


def _vidur_table(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "arrival_time_s": np.arange(n, dtype=float),
            "num_prefill_tokens": np.full(n, 7, dtype=np.int64),
            "num_decode_tokens": np.full(n, 3, dtype=np.int64),
            "ttft_s": np.linspace(0.01, 0.03, n),
            "tpot_s": np.linspace(0.001, 0.003, n),
            "e2e_s": np.linspace(0.1, 0.3, n),
            "last_token_time_s": np.arange(n, dtype=float) + 0.5,
            "num_restarts": np.zeros(n, dtype=np.int64),
        }
    )


def _steps(n: int) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "step_index": range(n),
            "time_s": np.nan,
            "num_prefill_requests": [0] * n,
            "num_prefill_tokens": [0] * n,
            "num_decode_requests": [2] * n,
            "num_decode_tokens": [2] * n,
            "elapsed_ms": [10.0 + i for i in range(n)],
            "kv_cache_usage_pct": np.nan,
        }
    )


def _workload(n: int) -> workloads.Workload:
    return workloads.Workload(
        np.arange(100, 100 + n, dtype=np.int64),
        np.arange(10, 10 + n, dtype=np.int64),
        np.arange(n, dtype=float),
    )


def stage_summaries(empty: bool) -> dict[str, float]:
    """One percentile statistic (ms where the stage reports ms) from every stage's summary, of a
    sample (``empty``: of a sample with nothing to summarize)."""
    n = 0 if empty else 5
    values = [] if empty else [0.001, 0.002, 0.003, 0.004, 0.005]
    records = [] if empty else [_record(i, float(i), [i + 0.5, i + 0.7, i + 1.0]) for i in range(n)]
    real = real_metrics.summarize(records)
    vidur = vidur_metrics.summarize(_vidur_table(n))
    workload = workloads.summarize(_workload(n))
    steps = compare_steps.compare_steps(_steps(5), _steps(n))
    errors = compare_metrics.error_summary(np.asarray(values))
    fidelity = fidelity_tables.real_percentiles(_requests(ok=not empty))
    spread = fidelity_tables.error_spread(pd.DataFrame({"abs_rel_error": values}, dtype=float))
    latency = pct.latency_ms(_requests(ok=not empty))
    return {
        "compare.distribution p95": compare_metrics.distribution(values).p95,
        "compare.distribution mean": compare_metrics.distribution(values).mean,
        "compare.error_summary p10": errors.p10,
        "compare.error_summary p90_abs": errors.p90_abs,
        "real_bench.distribution_ms median": real_metrics.distribution_ms(values)["median"],
        "real_bench.distribution_ms p99": real_metrics.distribution_ms(values)["p99"],
        "real_bench.summarize p90_ttft_ms": real["p90_ttft_ms"],
        "real_bench.summarize median_itl_ms": real["median_itl_ms"],
        "real_bench.summarize arrival_error p50": real["arrival_error_ms"]["p50"],
        "vidur_simulate.summarize ttft p90": vidur["ttft_s"]["p90"],
        "workload.summarize prefill p99": workload["num_prefill_tokens"]["p99"],
        "compare.steps batch_size_p90": steps.totals["sim"]["batch_size_p90"],
        "compare.steps median_step_ms": steps.totals["sim"]["median_step_ms"],
        "compare.steps sim_median_ms": float(steps.groups["sim_median_ms"].iloc[0]),
        "fidelity.real_percentiles e2e p90": fidelity[("client", "e2e", "p90")],
        "fidelity.error_spread median": spread["median_abs_error_pct"],
        "core.percentiles.latency_ms ttft_p95": latency["ttft_p95"],
    }


def test_every_stage_answers_nan_for_an_empty_sample() -> None:
    got = stage_summaries(empty=True)
    assert {k: v for k, v in got.items() if not _is_nan(v)} == {}


def test_every_stage_summarizes_with_the_one_routine(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the one routine's percentiles replaced by marker values, every stage shows them: a
    stage that computed its own percentiles again (a private list or routine) would not."""
    honest = stage_summaries(empty=False)
    assert all(math.isfinite(v) for v in honest.values()), honest
    marker = {q: 1000.0 + q for q in pct.PERCENTILES}  # p50 → 1050, p90 → 1090...
    monkeypatch.setattr(
        pct, "_percentiles_of", lambda data: np.array([marker[q] for q in pct.PERCENTILES])
    )
    got = stage_summaries(empty=False)
    want = {
        "compare.distribution p95": 1095.0,
        "compare.distribution mean": honest["compare.distribution mean"],  # not a percentile
        "compare.error_summary p10": 1010.0,
        "compare.error_summary p90_abs": 1090.0,
        "real_bench.distribution_ms median": 1050.0,
        "real_bench.distribution_ms p99": 1099.0,
        "real_bench.summarize p90_ttft_ms": 1090.0,
        "real_bench.summarize median_itl_ms": 1050.0,
        "real_bench.summarize arrival_error p50": 1050.0,
        "vidur_simulate.summarize ttft p90": 1090.0,
        "workload.summarize prefill p99": 1099.0,
        "compare.steps batch_size_p90": 1090.0,
        "compare.steps median_step_ms": 1050.0,
        "compare.steps sim_median_ms": 1050.0,
        "fidelity.real_percentiles e2e p90": 1090.0 * 1e3,
        "fidelity.error_spread median": 1050.0 * 100,
        "core.percentiles.latency_ms ttft_p95": 1095.0 * 1e3,
    }
    assert got == pytest.approx(want)


@pytest.mark.parametrize("module", STAGE_MODULES)
def test_no_stage_keeps_its_own_percentile_math_or_list(module: str) -> None:
    source = (PACKAGE / module).read_text()
    own_math = re.findall(
        r"\.(?:nan)?(?:percentile|quantile|median)\(|\bstatistics\.(?:median|quantiles)", source
    )
    assert own_math == [], f"{module} computes percentiles itself: use core.percentiles.describe"
    literal_names = re.findall(r"""["']p\d+["']""", source)
    assert literal_names == [], f"{module} names percentiles itself: use core.percentiles.names"


# --- stored keys stay as they were ---------------------------------------------------------------


def test_the_stored_keys_are_unchanged() -> None:
    assert compare_metrics.STATS == ("p50", "p90", "p95", "p99", "mean")
    assert [f.name for f in dataclasses.fields(compare_metrics.Distribution)] == [
        "count",
        "p50",
        "p90",
        "p95",
        "p99",
        "mean",
    ]
    assert [f.name for f in dataclasses.fields(compare_metrics.ErrorSummary)] == [
        "count",
        "mean",
        "p10",
        "p50",
        "p90",
        "mean_abs",
        "p90_abs",
        "within_10pct",
        "within_25pct",
    ]
    real = real_metrics.summarize([_record(0, 0.0, [0.5, 1.0])])
    latency_keys = {k for k in real if k.endswith("_ms") and not k.startswith(("arrival", "max"))}
    assert latency_keys == {
        f"{stat}_{metric}_ms"
        for metric in ("ttft", "tpot", "itl", "e2el")
        for stat in ("mean", "median", "std", "p50", "p90", "p99")
    }
    assert set(real["arrival_error_ms"]) == {"mean", "median", "std", "p50", "p90", "p99"}
    vidur = vidur_metrics.summarize(_vidur_table(3))
    assert list(vidur["ttft_s"]) == ["p50", "p90", "p99", "mean"]
    workload = workloads.summarize(_workload(3))
    assert list(workload["num_decode_tokens"]) == ["min", "mean", "p50", "p90", "p99", "max"]
    totals = compare_steps.compare_steps(_steps(3), _steps(3)).totals["real"]
    assert {k for k in totals if "_p" in k} == {
        "batch_size_p50",
        "batch_size_p90",
        "tokens_per_step_p50",
        "tokens_per_step_p90",
    }
    assert fidelity_tables.GOAL_STATS == ("p50", "p90")
    # capacity.csv's latency columns are latency_ms's keys
    columns = {f"{k}_ms" for k in pct.latency_ms(_requests(ok=True))}
    assert columns == {c for c in CAPACITY_TABLE.column_names if re.search(r"_p\d+_ms$", c)}


def _is_nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)
