"""What a step-time error does to the answer (``capacity.step_band``): the same search with every
simulated step ``1 ± step_band`` times as long (``vidur.step_time_scale``).

Near the goal a latency curve is flat, so a few percent of step time move the capacity by much
more: the band says by how much, in the search's own terms, before anyone trusts one figure. With
a real search beside it, ``capacity.json`` says whether the measured capacity fell inside.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpu_simulate_test.capacity.search import Answer, binding


def _side(scale: float, answer: Answer) -> dict[str, Any]:
    return {
        "step_time_scale": round(scale, 6),
        "answer_qps": answer.qps,
        "bracket_qps": list(answer.bracket),
        "binding": binding(answer),
        "note": answer.note,
    }


def band_record(fraction: float, answer: Answer, slower: Answer, faster: Answer) -> dict[str, Any]:
    """``capacity.json`` ``step_band``: the answers with every step ``1 + fraction`` (slower) and
    ``1 - fraction`` (faster) times as long, and how far each is from the answer."""

    def moved(other: Answer) -> float | None:
        # an answer still meeting the goals at the search's top is a lower bound: no move
        # from it can be read (both sides met the top too, and read +0%)
        if answer.qps is None or other.qps is None or answer.bracket[1] is None:
            return None
        return round(other.qps / answer.qps - 1.0, 4)

    record = {
        "fraction": fraction,
        "qps": [slower.qps, faster.qps],
        "moved": [moved(slower), moved(faster)],
        "open_above": faster.bracket[1] is None and faster.qps is not None,
        "slower": _side(1.0 + fraction, slower),
        "faster": _side(1.0 - fraction, faster),
    }
    needed = step_accuracy_needed(record)
    record["step_accuracy_for_10pct"] = None if needed is None else round(needed, 4)
    return record


def in_band(measured_qps: float | None, band: Mapping[str, Any] | None) -> bool | None:
    """Whether a measured capacity lies between the slower and the faster answer (a side with no
    rate that met the goals is 0; a faster search still meeting them at its top is open above);
    None without both."""
    if measured_qps is None or band is None:
        return None
    low, high = band["qps"]
    if low is not None and measured_qps < low:
        return False
    if band["open_above"]:
        return True
    return high is not None and measured_qps <= high


def _qps(value: float | None, unit: str) -> str:
    return "none" if value is None else f"{value:g} {unit}"


def band_markdown(
    band: Mapping[str, Any] | None, measured_in_band: bool | None, unit: str = "req/s"
) -> list[str]:
    """The report's paragraph on the band (its rates in ``unit``)."""
    if not band:
        return []
    pct = f"{band['fraction']:.0%}"
    low, high = band["qps"]
    more = " or more" if _slower_open(band) else ""
    parts = []
    for label, moved in zip(("slower", "faster"), band["moved"], strict=True):
        if moved is not None:
            parts.append(f"{moved:+.0%} with {label} steps")
    lines = [
        "",
        f"**If every step took {pct} longer, the answer would be {_qps(low, unit)}{more}; {pct} "
        "shorter, "
        f"{_qps(high, unit)}{' or more' if band['open_above'] else ''}** "
        f"(`capacity.step_band={band['fraction']:g}`"
        + (f": {', '.join(parts)}" if parts else "")
        + ").",
    ]
    needed = band["step_accuracy_for_10pct"]
    if needed is not None:
        lines[-1] += (
            f" A capacity within ±10% needs the step time right within about ±{needed:.0%} "
            "here (near the goal the latency curve is flat)."
        )
    if measured_in_band is not None:
        lines += [
            "",
            "The measured capacity is "
            + ("inside" if measured_in_band else "**outside**")
            + " that band.",
        ]
    return lines


def _slower_open(band: Mapping[str, Any]) -> bool:
    """Whether the slower search too still met the goals at its top (its answer a lower
    bound)."""
    slower = band.get("slower") or {}
    bracket = slower.get("bracket_qps") or [None, None]
    return slower.get("answer_qps") is not None and bracket[1] is None


def step_accuracy_needed(band: Mapping[str, Any], target: float = 0.10) -> float | None:
    """The step-time accuracy a capacity within ±``target`` needs, read linearly off the band:
    ``target`` × fraction / the larger move; None where a side has no answer."""
    moves = [abs(m) for m in band["moved"] if m is not None]
    if len(moves) < 2 or max(moves) == 0:
        return None
    return float(target * band["fraction"] / max(moves))


def band_cells(band: Mapping[str, Any] | None) -> str:
    """The console's cell: ``low–high`` (the rate's unit is in its row's label)."""
    if not band:
        return "–"
    low, high = band["qps"]
    top = f"{high:g}{'+' if band['open_above'] else ''}" if high is not None else "none"
    bottom = "none" if low is None else f"{low:g}{'+' if _slower_open(band) else ''}"
    return f"{bottom} – {top}"
