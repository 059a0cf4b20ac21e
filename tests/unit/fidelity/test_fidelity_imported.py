"""The plan the fidelity sim phase makes of an import (:mod:`gpu_simulate_test.fidelity.imported`),
on hand-built runs: which runs are loads and which their repeats, where the capacity comes from,
and what the report says of the noise floor."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.fidelity.imported import (
    ImportedRunDirs,
    capacity_of,
    check_window,
    group_loads,
    is_import,
    load_sizes,
    noise_floor,
)
from gpu_simulate_test.io.artifacts import ArtifactError


def run(
    index: int,
    offered_qps: float,
    nominal_qps: float | None = None,
    burst: bool = False,
    arrivals: list[float] | None = None,
    e2e: list[float] | None = None,
) -> ImportedRunDirs:
    arrival = np.asarray(arrivals if arrivals is not None else [0.0, 1.0, 2.0, 3.0])
    e2e_s = np.asarray(e2e if e2e is not None else [0.5] * len(arrival))
    requests = pd.DataFrame(
        {
            "arrival_time_s": arrival,
            "scheduled_arrival_time_s": arrival,
            "e2e_s": e2e_s,
            "num_decode_tokens": 8,
            "status": "ok",
        }
    )
    return ImportedRunDirs(
        index=index,
        label=f"run {index}",
        workload_dir=Path(f"/w/{index}"),
        real_dir=Path(f"/r/{index}"),
        requests=requests,
        offered_qps=offered_qps,
        nominal_qps=nominal_qps,
        burst=burst,
    )


def test_runs_told_one_rate_are_one_load_in_rate_order_and_bursts_are_none() -> None:
    runs = [
        run(0, 4.1, nominal_qps=4.0),
        run(1, 1.9, nominal_qps=2.0),
        run(2, 3.8, nominal_qps=4.0),  # the same rate told: run 0's repeat
        run(3, math.inf, burst=True),
        run(4, 3.0),  # no rate told (synchronous): a load of its own
        run(5, 3.0),
    ]
    loads = group_loads(runs)
    assert [[r.index for r in group] for group in loads] == [[1], [4], [5], [0, 2]]


def test_capacity_given_else_a_burst_else_the_highest_offered_rate() -> None:
    slow, fast = run(0, 2.0, 2.0), run(1, 5.0, 5.0)
    # a burst of 4 sent at 0: completions at 1, 2, 3, 4 s, so 4 requests in 4 s
    burst = run(2, math.inf, burst=True, arrivals=[0.0] * 4, e2e=[1.0, 2.0, 3.0, 4.0])
    loads = group_loads([slow, fast, burst])
    given = capacity_of(8.0, [slow, fast, burst], loads)
    assert given["capacity_qps"] == 8.0 and given["derived_from"] == "fidelity.capacity_qps"
    assert given["probe_run"] is None
    measured = capacity_of(0.0, [slow, fast, burst], loads)
    assert measured["capacity_qps"] == pytest.approx(1.0)
    assert measured["probe_run"] == "/r/2" and measured["probe_requests"] == 4
    assert "capacity probe's rule" in measured["source"]
    highest = capacity_of(0.0, [slow, fast], group_loads([slow, fast]))
    assert highest["capacity_qps"] == 5.0 and highest["derived_from"] == "highest offered rate"
    assert "run 1" in highest["source"] and "not a measured capacity" in highest["source"]


def test_noise_floor_is_unknown_for_loads_without_a_second_run() -> None:
    one, two = [run(0, 2.0)], [run(1, 4.0, 4.0), run(2, 4.0, 4.0)]
    assert noise_floor([one], [1.0]).startswith("unknown for the loads at 100% of capacity")
    both = noise_floor([one, two], [0.5, 1.0])
    assert "unknown for the loads at 50%" in both and both.endswith("the others: real vs real")
    assert noise_floor([two], [1.0]).startswith("from the imported runs at the same rate")


def test_a_warm_up_over_every_arrival_is_refused_naming_the_run() -> None:
    check_window(run(0, 1.0), warmup_s=3.0)  # the request at 3 s is measured
    with pytest.raises(ArtifactError, match=r"/r/0: every one of its 4 requests.*warmup_s=0"):
        check_window(run(0, 1.0), warmup_s=3.5)


def test_an_import_is_told_apart_by_its_run_meta_or_manifest(tmp_path: Path) -> None:
    assert not is_import(tmp_path)
    (tmp_path / "run_meta.json").write_text('{"stage": "fidelity"}')
    assert not is_import(tmp_path)
    (tmp_path / "run_meta.json").write_text('{"stage": "bench_import"}')
    assert is_import(tmp_path)  # even without its import.json (refused later, by name)


def test_loads_of_different_lengths_report_the_range_not_the_shortest() -> None:
    short = run(0, 2.0, 2.0, arrivals=[0.0, 1.0, 2.0, 3.0])  # 3 s of arrivals, 4 requests
    long = run(1, 4.0, 4.0, arrivals=[0.25 * i for i in range(25)])  # 6 s, 25 requests
    assert load_sizes([[short], [long]]) == {
        "requests_per_load": "4–25",
        "load_duration_s": "3.0–6.0",
    }
    # one length: one value, a number
    assert load_sizes([[short], [run(2, 4.0, 4.0)]]) == {
        "requests_per_load": 4,
        "load_duration_s": 3.0,
    }
