"""``capacity.sim_seeds``: the simulated search run under several noise seeds, the median one
answering.

The simulated steps carry the calibration's slow moments and spreads, drawn from
``vidur.seed``; near the knee one seed moves an answer by several percent (on the tune
benchmark's bundle, twelve seeds put one configuration's capacity between 129 and 169 req/s,
benchmarks/results/tune_seeds_20261204). The search runs once per seed (``vidur.seed``, +1, ...)
and answers with the median seed's search (the lower middle one for an even count), its curve
and its binding goals from that one search; ``capacity.json`` ``sim_seeds`` keeps every seed's
answer and their spread beside it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_simulate_test.capacity.search import Answer
from gpu_simulate_test.config.vidur import derived_seed


def median_position(values: Sequence[float]) -> int:
    """The position of the median value (the lower middle one for an even count; of equal
    values, the first): the seed that answers, in the capacity stage and the tune alike."""
    return list(values).index(sorted(values)[(len(values) - 1) // 2])


def spread(values: Sequence[float]) -> float | None:
    """max / min − 1 of ``values`` (rounded to 4 places; None under two values)."""
    return round(max(values) / min(values) - 1, 4) if len(values) > 1 else None


def median_seed(answers: Sequence[Answer]) -> int:
    """The position of the median answer (:func:`median_position`; a search that met no rate
    counts lowest)."""
    return median_position([-1.0 if a.qps is None else float(a.qps) for a in answers])


def seeds_record(answers: Sequence[Answer], first_seed: int, chosen: int) -> dict[str, Any]:
    """``capacity.json`` ``sim_seeds``: the seeds, each one's answer (null: no rate met the
    goals), the seed that answers, and the answers' spread (max / min − 1; null under two
    answers)."""
    return {
        "count": len(answers),
        "seeds": [derived_seed(first_seed, k) for k in range(len(answers))],
        "answers_qps": [a.qps for a in answers],
        "chosen_seed": derived_seed(first_seed, chosen),
        "spread": spread([float(a.qps) for a in answers if a.qps is not None]),
    }


def answers_text(record: Mapping[str, Any]) -> str:
    """Each seed's answer, in seed order (``none``: no rate met the goals)."""
    return ", ".join("none" if v is None else f"{v:g}" for v in record["answers_qps"])


def seeds_said(seeds: Sequence[int]) -> str:
    """Noise seeds in words: a range where they run on (``42–44``), else each
    (``4294967295, 0, 1``: :func:`~..config.vidur.derived_seed` wrapped)."""
    if list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(str(s) for s in seeds)


def seeds_sentence(record: Mapping[str, Any], unit: str) -> str:
    """``sim_seeds`` in one line, for the terminal and the report."""
    seeds = record["seeds"]
    said = answers_text(record)
    spread = record.get("spread")
    apart = "" if spread is None else f", {100 * spread:.0f}% apart"
    return (
        f"the search under {record['count']} noise seeds ({seeds_said(seeds)}) answered "
        f"{said} {unit}{apart}; the median one (seed {record['chosen_seed']}) answers"
    )
