"""A simulated fleet's per-replica report (``run_meta.json`` ``fleet``): the requests each
engine took and their latency, so imbalance shows (one replica's queue growing while the others
idle is what users of data-parallel serving report)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.config.fleet import FleetConfig
from gpu_simulate_test.core.metrics.percentiles import latency_ms
from gpu_simulate_test.simulator.types import ENGINE

PER_REPLICA_PERCENTILES = (50, 90)


def fleet_meta(table: pd.DataFrame, fleet: FleetConfig) -> dict[str, Any] | None:
    """Per replica: requests, their share, TTFT and E2E p50/p90 (ms) on the simulated client's
    clock; None for one engine (no ``engine`` column)."""
    if ENGINE not in table.columns:
        return None
    engines = table[ENGINE].to_numpy(dtype=np.int64)
    rows = []
    for k in range(fleet.replicas):
        mine = table[engines == k]
        row: dict[str, Any] = {
            "engine": k,
            "requests": len(mine),
            "share": round(len(mine) / len(table), 4) if len(table) else None,
        }
        for key, ms in latency_ms(mine, ("ttft", "e2e"), PER_REPLICA_PERCENTILES).items():
            row[f"{key}_ms"] = round(ms, 3) if np.isfinite(ms) else None
        rows.append(row)
    counts = [row["requests"] for row in rows]
    return {
        "replicas": fleet.replicas,
        "router": fleet.router,
        "per_replica": rows,
        "imbalance": round(max(counts) / (sum(counts) / len(counts)), 4) if sum(counts) else None,
    }


def fleet_rows(meta: dict[str, Any]) -> list[list[str]]:
    """The per-replica table for the console."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f}"

    return [
        [
            str(row["engine"]),
            str(row["requests"]),
            ms(row["ttft_p50_ms"]),
            ms(row["ttft_p90_ms"]),
            ms(row["e2e_p50_ms"]),
            ms(row["e2e_p90_ms"]),
        ]
        for row in meta["per_replica"]
    ]
