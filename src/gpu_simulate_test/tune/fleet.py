"""How many GPUs: a tune whose space holds fleets (``tune.space.replicas``, ``tune.space.router``)
answers with the fewest GPUs whose simulated capacity meets the goals at ``tune.target_qps``,
and with the frontier of GPUs against capacity (the most any configuration of each GPU count
serves, kept where it grows with the GPUs)."""

from __future__ import annotations

import math
from typing import Any

from gpu_simulate_test.config.tune import TuneStageConfig
from gpu_simulate_test.tune.simulate import Simulated
from gpu_simulate_test.tune.space import deployment


def most_replicas(cfg: TuneStageConfig) -> int:
    """The largest fleet of the space (1 without ``tune.space.replicas``)."""
    return max(cfg.tune.knobs().get("replicas", (1,)))


def capacity_of(sim: Simulated) -> float:
    return -1.0 if sim.capacity is None or sim.error else float(sim.capacity)


def frontier(order: list[Simulated]) -> list[dict[str, Any]]:
    """For each GPU count, its best configuration by simulated capacity, kept where the capacity
    grows with the GPUs (more GPUs serving no more are off the frontier)."""
    best: dict[int, Simulated] = {}
    for sim in order:
        gpus, value = sim.candidate.gpus, capacity_of(sim)
        if value > 0 and (gpus not in best or value > capacity_of(best[gpus])):
            best[gpus] = sim
    rows, highest = [], -math.inf
    for gpus in sorted(best):
        sim = best[gpus]
        if capacity_of(sim) > highest:
            highest = capacity_of(sim)
            rows.append(
                {
                    "gpus": gpus,
                    "config_id": sim.candidate.config_id,
                    "router": sim.candidate.routed_by,
                    "capacity_qps": sim.capacity,
                    "capacity_per_gpu_qps": round(capacity_of(sim) / gpus, 3),
                }
            )
    return rows


def fewest_meeting(order: list[Simulated], target_qps: float) -> Simulated | None:
    """The configuration of fewest GPUs whose simulated capacity reaches ``target_qps`` (the
    most capacity among those of that many); None when none does."""
    meets = [s for s in order if capacity_of(s) >= target_qps]
    if not meets:
        return None
    fewest = min(s.candidate.gpus for s in meets)
    return max((s for s in meets if s.candidate.gpus == fewest), key=capacity_of)


def target_answer(order: list[Simulated], target_qps: float, model: str) -> dict[str, Any]:
    """``tune.target_qps``: the fewest GPUs whose simulated capacity reaches ``target_qps`` (the
    most capacity among configurations of that many), how to run it, and the runner-up count;
    or, when none reaches it, the largest capacity found and what is missing."""
    pick = fewest_meeting(order, target_qps)
    if pick is None:
        top = max(order, key=capacity_of, default=None)
        most = capacity_of(top) if top is not None else -1.0
        return {
            "target_qps": target_qps,
            "config_id": None,
            "gpus": None,
            "note": (
                f"no configuration of the space reaches {target_qps:g} req/s within the goals "
                f"(the most: {max(most, 0.0):g} req/s"
                + (f", {top.candidate.config_id}" if top is not None and most > 0 else "")
                + "): add replicas to tune.space.replicas"
            ),
        }
    return {
        "target_qps": target_qps,
        "config_id": pick.candidate.config_id,
        "gpus": pick.candidate.gpus,
        "replicas": pick.candidate.replicas,
        "router": pick.candidate.routed_by,
        "capacity_qps": pick.capacity,
        "headroom_pct": round(100.0 * (capacity_of(pick) / target_qps - 1.0), 1),
        "knobs": dict(pick.candidate.knobs),
        "deploy": deployment(pick.candidate, model),
        "note": "",
    }
