"""``fleet.*`` in the capacity stage through its CLI on a synthetic bundle (simulation only):
N engines behind a router serve about N times one engine's rate within the same goals, each rate
simulated as the fleet (every engine's share of the requests), and the answer names its fleet."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gpu_simulate_test.capacity import contract
from tests.conftest import run_cli
from tests.integration.test_capacity_window import BLOCK, SEARCH
from tests.vidur_bundle_factory import SyntheticRanges, write_synthetic_bundle

pytestmark = pytest.mark.integration


def test_two_engines_behind_a_router_serve_about_twice_one(tmp_path: Path) -> None:
    write_synthetic_bundle(tmp_path / "profiles", ranges=SyntheticRanges(block_size=BLOCK))
    run_cli("capacity", *SEARCH, "output.run_id=one", cwd=tmp_path)
    run_cli("capacity", *SEARCH, "fleet.replicas=2", "fleet.router=round_robin",
            "output.run_id=two", cwd=tmp_path)  # fmt: skip
    runs = tmp_path / "tmp" / "capacity"
    one, two = (json.loads((runs / r / contract.CAPACITY_JSON).read_text()) for r in ("one", "two"))
    scrape = {"poll_s": 0.05, "router_seed": 0}
    assert one["fleet"] == {"replicas": 1, "router": "vllm_dp", **scrape}
    assert two["fleet"] == {"replicas": 2, "router": "round_robin", **scrape}
    ratio = two["answer_qps"] / one["answer_qps"]
    assert 1.6 <= ratio <= 2.6, (one["answer_qps"], two["answer_qps"])
    # each rate simulated as the fleet: round robin gives each engine every other request
    rate = f"{two['answer_qps']:g}"
    table = pd.read_csv(runs / "two" / contract.POINTS_DIR / rate / "request_metrics.csv")
    assert "engine" in table.columns, list(table.columns)
    shares = table["engine"].value_counts()
    assert sorted(shares.index) == [0, 1] and abs(shares[0] - shares[1]) <= 1
    report = (runs / "two" / contract.REPORT_MD).read_text()
    assert "2 replicas behind round_robin" in report
