"""A fleet, real against simulated: where each request went, and each replica's latency (pure:
frames in, a JSON block and text out).

Both sides say per request which engine served it (an ``engine`` column of
``request_metrics``: the real run's vLLM data-parallel rank, ``backend.data_parallel_size``; the
simulation's replica, ``fleet.replicas``). The **routing table** counts the compared requests
per replica on each side; the **same-replica fraction** is the share of compared requests the
simulation sent to the replica the real server's balancer chose (1.0 for a router that decides
as vLLM did on the same counts; a round robin's is exact by construction). Latency per replica
is on the engine's own clock on both sides (:mod:`.clocks`): the real ``engine_*`` columns, the
simulation without the front-end delay it added.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.clocks import ENGINE_COLUMNS, sim_engine_metric
from gpu_simulate_test.compare.prefix_cache import REAL_COLUMNS, SIM_COLUMNS, side_cached
from gpu_simulate_test.core.engines.router_reads import READ_BY_CLIENT
from gpu_simulate_test.core.metrics import percentiles as pct
from gpu_simulate_test.core.reporting import markdown_table
from gpu_simulate_test.io.schemas import FLEET_COLUMN

ENGINE = FLEET_COLUMN.name
LATENCY: tuple[str, ...] = ("ttft", "e2e")
"""The per-replica metrics (engine clock)."""


def engines_of(frame: pd.DataFrame | None, request_id: np.ndarray) -> np.ndarray | None:
    """Per request of ``request_id``, the engine that served it (-1: none recorded); None where
    the run has no ``engine`` column (one engine)."""
    if frame is None or ENGINE not in frame.columns:
        return None
    values = pd.to_numeric(
        frame.set_index("request_id").reindex(request_id)[ENGINE], errors="coerce"
    ).to_numpy(dtype=float)
    return np.where(np.isfinite(values), values, -1).astype(np.int64)


def compare_routing(
    real: pd.DataFrame,
    sim: pd.DataFrame,
    joined: m.JoinedRequests,
    oracle: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The routing block of ``comparison.json`` (None where neither run is a fleet; a
    ``skipped`` reason where only one is); ``oracle``: the simulation's oracle replay report
    (``run_meta.json``'s ``oracle``), which says whose load its router read."""
    ids = joined.request_id
    real_engine, sim_engine = engines_of(real, ids), engines_of(sim, ids)
    if real_engine is None and sim_engine is None:
        return None
    if real_engine is None or sim_engine is None:
        side = "real run" if real_engine is not None else "simulation"
        other = "simulation" if real_engine is not None else "real run"
        hint = (
            "simulate it as a fleet: fleet.replicas=<the server's --data-parallel-size> "
            "fleet.router=vllm_dp"
            if real_engine is not None
            else "run the truth as one: backend.data_parallel_size=<fleet.replicas>"
        )
        return {"skipped": f"only the {side} is a fleet (the {other} is one engine): {hint}"}
    replicas = int(max(real_engine.max(initial=0), sim_engine.max(initial=0)) + 1)
    both = (real_engine >= 0) & (sim_engine >= 0)
    frame = real.set_index("request_id").reindex(ids)
    cached = (side_cached(real, ids, REAL_COLUMNS)[0], side_cached(sim, ids, SIM_COLUMNS)[0])
    prompts = np.asarray(joined.num_prefill_tokens, dtype=float)
    rows = []
    for k in range(replicas):
        on_real, on_sim = real_engine == k, sim_engine == k
        row: dict[str, Any] = {
            "replica": k,
            "real_requests": int(on_real.sum()),
            "sim_requests": int(on_sim.sum()),
            "real_share": float(on_real.mean()) if len(ids) else float("nan"),
            "sim_share": float(on_sim.mean()) if len(ids) else float("nan"),
        }
        for metric in LATENCY:
            real_s = pd.to_numeric(frame[ENGINE_COLUMNS[metric]], errors="coerce").to_numpy(float)
            sim_s = sim_engine_metric(sim, joined, metric)
            for side, values, mask in (("real", real_s, on_real), ("sim", sim_s, on_sim)):
                summary = pct.describe(values[mask], scale=1e3)
                for q in ("p50", "p90"):
                    row[f"{side}_{metric}_{q}_ms"] = summary.stat(q)
        for side, hits, mask in (("real", cached[0], on_real), ("sim", cached[1], on_sim)):
            row[f"{side}_hit_rate"] = replica_hit_rate(hits, prompts, mask)
        rows.append(row)
    counts = np.array([[r["real_requests"], r["sim_requests"]] for r in rows], dtype=float)
    gap = np.abs(counts[:, 1] - counts[:, 0]) / np.maximum(counts[:, 0], 1.0)
    return {
        "replicas": replicas,
        "compared": int(both.sum()),
        "same_replica_fraction": float((real_engine == sim_engine)[both].mean())
        if both.any()
        else None,
        "largest_count_gap_pct": float(100.0 * gap.max()) if len(gap) else None,
        "largest_hit_rate_gap_points": hit_rate_gap(rows),
        "router_reads": (oracle or {}).get("router_reads"),
        "per_replica": rows,
    }


def replica_hit_rate(hits: np.ndarray | None, prompts: np.ndarray, on: np.ndarray) -> float | None:
    """vLLM's hit rate of one replica's requests on one side: their cached prompt tokens over
    their prompt tokens (first admissions); None without per-request hits or requests."""
    if hits is None:
        return None
    known = on & np.isfinite(hits)
    queries = float(prompts[known].sum())
    return float(hits[known].sum()) / queries if queries else None


def hit_rate_gap(rows: list[dict[str, Any]]) -> float | None:
    """The largest |simulated − real| per-replica hit rate, in percentage points."""
    gaps = [
        100.0 * abs(r["sim_hit_rate"] - r["real_hit_rate"])
        for r in rows
        if r.get("real_hit_rate") is not None and r.get("sim_hit_rate") is not None
    ]
    return max(gaps) if gaps else None


def routing_markdown(block: dict[str, Any] | None) -> str:
    """The ``summary.md`` section of :func:`compare_routing`'s block ('' without one)."""
    if block is None:
        return ""
    if "skipped" in block:
        return f"\n## Routing (a fleet)\n\n{block['skipped']}.\n"
    same = block["same_replica_fraction"]
    header = [
        "replica",
        "requests real",
        "requests sim",
        "TTFT p50 real / sim (ms)",
        "TTFT p90 real / sim (ms)",
        "E2E p50 real / sim (ms)",
        "E2E p90 real / sim (ms)",
    ]
    hits = block.get("largest_hit_rate_gap_points") is not None
    if hits:
        header.append("prefix-cache hit rate real / sim")
    body = [
        [
            str(r["replica"]),
            f"{r['real_requests']} ({100 * r['real_share']:.0f}%)",
            f"{r['sim_requests']} ({100 * r['sim_share']:.0f}%)",
            *(
                f"{r[f'real_{metric}_{q}_ms']:.1f} / {r[f'sim_{metric}_{q}_ms']:.1f}"
                for metric in LATENCY
                for q in ("p50", "p90")
            ),
            *([f"{_pct(r['real_hit_rate'])} / {_pct(r['sim_hit_rate'])}"] if hits else []),
        ]
        for r in block["per_replica"]
    ]
    lead = (
        f"{block['replicas']} replicas; the simulation sent "
        f"{'n/a' if same is None else f'{100 * same:.1f}%'} of {block['compared']} compared "
        "requests to the replica the real server chose (`routing.same_replica_fraction`); "
        f"the largest gap in requests per replica is {block['largest_count_gap_pct']:.1f}%"
        + (
            f", in a replica's prefix-cache hit rate {block['largest_hit_rate_gap_points']:.1f} "
            "points"
            if hits
            else ""
        )
        + ". Latency on the engine's own clock."
        + (
            " The simulated router read the load the real client's router read "
            "(`router_reads.csv`): the same code on the same inputs, so any request sent "
            "elsewhere is a defect, not timing."
            if block.get("router_reads") == READ_BY_CLIENT
            else ""
        )
    )
    return f"\n## Routing (a fleet)\n\n{lead}\n\n{markdown_table(header, body)}\n"


def _pct(rate: float | None) -> str:
    return "n/a" if rate is None else f"{100 * rate:.1f}%"
