"""The simulation's own draws beside the truth's (``compare.sim_seed_dirs``): the same workload
simulated with other seeds, and per metric and statistic the range of the simulator's error over
all its seeds on each clock.

The truth's repeat says how far one real run is from another; the seeds say how far one
simulated run is from another. A simulation draws the steps' spread, the front end's and the
wake-ups per seed, and on the main job's 40 requests four seeds of one run moved its client
TTFT p90 by 4–16 points (benchmarks/results/tail_requests_20261205): an error inside that range
says as little about the model as one inside the truth's. Reported beside the verdict, never
judged: the verdict stays the main simulation's against max(band, real vs real).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.clocks import sim_engine_metric
from gpu_simulate_test.compare.comparison import join_requests
from gpu_simulate_test.core.run_inputs import RunInput, check_same_workload, load_run


@dataclass(frozen=True)
class SeedRun:
    """One more simulation of the workload, joined to the real run's requests."""

    path: Path
    seed: int | None
    """Its ``vidur.seed`` (None where its run_meta does not say)."""
    requests: pd.DataFrame
    joined: m.JoinedRequests


def seed_of(run: RunInput) -> int | None:
    """The ``vidur.seed`` a simulation ran with, from its resolved config."""
    seed = run.meta.get("config", {}).get("vidur", {}).get("seed")
    return int(seed) if isinstance(seed, int) else None


def load_seeds(dirs: Sequence[str], real: RunInput, real_requests: pd.DataFrame) -> list[SeedRun]:
    """Each run of ``dirs`` (vidur_simulate runs of ``real``'s workload), joined to the real
    requests kept after the warm-up; ValueError naming the run where one is of another
    workload or its requests do not match."""
    return [seed_run(load_run(d, "vidur_simulate"), real, real_requests) for d in dirs]


def seed_run(run: RunInput, real: RunInput, real_requests: pd.DataFrame) -> SeedRun:
    """One loaded vidur_simulate ``run`` of ``real``'s workload, joined to the real requests
    kept after the warm-up (ValueError as :func:`load_seeds`)."""
    check_same_workload(real, run)
    kept = run.requests[run.requests["request_id"].isin(real_requests["request_id"])]
    joined, _ = join_requests(real_requests, kept, where=f"{real.path} vs {run.path}")
    return SeedRun(run.path, seed_of(run), kept, joined)


def with_seeds(
    rows: list[dict[str, Any]] | None,
    seeds: Sequence[SeedRun],
    main: SeedRun | None = None,
) -> list[dict[str, Any]] | None:
    """The clocks rows (:func:`~.clocks.clock_rows`) with, per row, each seed's simulated
    value on both clocks (``seeds_sim_s``, ``seeds_sim_engine_s``) and the range of the error
    over the main simulation and every seed (``seeds_vs_engine``, ``seeds_vs_client``: [lowest,
    highest]); with the ``main`` simulation's requests too, the figure of every seed's requests
    pooled (``pooled_sim_s``, ``pooled_sim_engine_s``) and its errors (``pooled_vs_engine``,
    ``pooled_vs_client``): the model's own distribution read off three times the requests, the
    steadier estimate. The rows as they are without seeds."""
    if not rows or not seeds:
        return rows
    values: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    pooled: dict[tuple[str, str], tuple[float, float]] = {}
    for metric in {r["metric"] for r in rows}:
        stats = {r["stat"] for r in rows if r["metric"] == metric}
        clients, engines = [], []
        for seed in seeds:
            clients.append(seed.joined.sim.metric(metric))
            engines.append(sim_engine_metric(seed.requests, seed.joined, metric))
            on_client, on_engine = m.distribution(clients[-1]), m.distribution(engines[-1])
            for stat in stats:
                pair = values.setdefault((metric, stat), ([], []))
                pair[0].append(float(getattr(on_client, stat)))
                pair[1].append(float(getattr(on_engine, stat)))
        if main is not None:
            clients.append(main.joined.sim.metric(metric))
            engines.append(sim_engine_metric(main.requests, main.joined, metric))
            all_client = m.distribution(np.concatenate(clients))
            all_engine = m.distribution(np.concatenate(engines))
            for stat in stats:
                pooled[metric, stat] = (
                    float(getattr(all_client, stat)),
                    float(getattr(all_engine, stat)),
                )
    out = []
    for row in rows:
        key = row["metric"], row["stat"]
        client, engine = values[key]
        more = {}
        if key in pooled:
            client_s, engine_s = pooled[key]
            more = {
                "pooled_sim_s": client_s,
                "pooled_sim_engine_s": engine_s,
                "pooled_vs_engine": m.relative_error(engine_s, row["engine_s"]),
                "pooled_vs_client": m.relative_error(client_s, row["client_s"]),
            }
        out.append(
            {
                **row,
                "seeds_sim_s": client,
                "seeds_sim_engine_s": engine,
                "seeds_vs_engine": error_range(row["sim_engine_s"], engine, row["engine_s"]),
                "seeds_vs_client": error_range(row["sim_s"], client, row["client_s"]),
                **more,
            }
        )
    return out


def error_range(main: float, others: Sequence[float], real: float) -> list[float]:
    """[lowest, highest] error against ``real`` over ``main`` and ``others`` (NaN for none
    finite)."""
    errors = [m.relative_error(v, real) for v in (main, *others)]
    finite = [e for e in errors if np.isfinite(e)]
    if not finite:
        return [float("nan"), float("nan")]
    return [min(finite), max(finite)]


def seeds_note(seeds: Sequence[SeedRun]) -> str:
    """What the seeds' column says, for ``summary.md``."""
    named = [str(s.seed) for s in seeds if s.seed is not None]
    which = f" (seeds {', '.join(named)})" if len(named) == len(seeds) else ""
    return (
        f" *Over its seeds*: the simulation run again with {len(seeds)} other seed"
        f"{'s' if len(seeds) != 1 else ''}{which} on the same arrivals and bundle, the range of "
        "its error over all of them (the simulator's own draws, as real vs real is the "
        "truth's) and, *pooled*, the error of every seed's requests taken together (the "
        "model's figure read off more requests); reported, not judged."
    )
