"""The real search's rule, pure: from a seed rate, step by a factor until one rate meets the goals
and another misses them, then bisect until the bracket is narrow enough, and stop; within a
budget of wall seconds. Each evaluation is one real run (:mod:`.real_search`); here it is any
function of the rate, which is how the tests drive it.

Unlike the simulated search (:mod:`.search`), no grid: a real rate costs its seconds of arrivals
and more, so the search starts where the capacity is expected (the simulated answer, or a burst
probe's throughput) and runs only the rates that narrow the bracket.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpu_simulate_test.capacity.search import Answer, Point, rounded

MAX_STEPS = 6
"""Rates tried past the seed in one direction before the search gives up on a bracket (a factor
of ``step ** MAX_STEPS`` from it: 64x with the default step of 2; a smaller step widens to
:data:`WIDEN_TO`, 21x from 1.15)."""
WIDEN_TO = 2.0
"""The real search's steps widen to this factor (:attr:`BracketRule.widen_to`)."""
PHASES: tuple[str, ...] = ("seed", "step", "bisect")
"""The ``phase`` of each real rate: the seed, the steps to a bracket, the bisection."""
ROUNDING = 1e-3
"""How far a bracket's width may exceed ``1 + bracket`` and still count as narrow: its rates are
rounded to 4 significant digits (:func:`~.search.rounded`), each end by up to 5e-4 of itself, so a
step of exactly ``1 + bracket`` (``tune.verify``: 35.33 → 40.63, a ratio of 1.15001) is as narrow
as asked, not one bisection short of it."""


@dataclass(frozen=True)
class BracketRule:
    """How the search narrows the bracket and when it stops (``capacity.verify_*``)."""

    step: float = 2.0
    """The factor between the seed's neighbours until one meets and one misses."""
    bracket: float = 0.1
    """Bisect until high / low ≤ 1 + this."""
    budget_s: float = 0.0
    """Wall seconds the whole search may take (0: no budget)."""
    max_steps: int = MAX_STEPS
    first_step: float = 0.0
    """The factor of the first step from the seed (0: ``step``): a seed expected close to the
    knee (a neighbour's answer) brackets it at once with a step the bracket's own width."""
    widen_to: float = 0.0
    """A step smaller than this factor squares after each step that did not bracket, up to it
    (0: ``step`` throughout): a search that starts with small steps near the expected capacity
    still reaches one far from it (``tune.verify``'s 1.15 covered 2.3x in six steps; a seed
    2.3x above the real capacity found no rate that met the goals, CI 2026-12-07)."""

    def factor(self, k: int) -> float:
        """The factor of step ``k`` (0: the first) from the seed."""
        if k == 0 and self.first_step:
            return self.first_step
        factor = self.step
        for _ in range(k if self.widen_to > self.step else 0):
            factor = min(factor * factor, self.widen_to)
        return factor

    def narrow(self, low: float, high: float) -> bool:
        """Whether ``low``..``high`` is as narrow as asked (high / low ≤ 1 + ``bracket``, within
        the rates' rounding: :data:`ROUNDING`)."""
        return high / low <= (1 + self.bracket) * (1 + ROUNDING)


@dataclass(frozen=True)
class Stopped:
    """Why the search ended before its bracket was narrow enough: a rate that would not fit."""

    next_qps: float
    expected_s: float
    """What that rate was expected to take (its arrivals and the overhead seen so far)."""
    left_s: float
    """What was left of the budget."""

    def sentence(self, budget_s: float, unit: str) -> str:
        left = (
            f"{self.left_s:.0f} s were left"
            if self.left_s >= 0
            else f"the search had already run {-self.left_s:.0f} s past it (a rate took longer "
            "than expected: its re-runs, or a slower host)"
        )
        return (
            f"stopped by capacity.verify_budget_s={budget_s:g}: the next rate, "
            f"{self.next_qps:g} {unit}, would take about {self.expected_s:.0f} s and {left}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "next_qps": self.next_qps,
            "expected_s": round(self.expected_s, 1),
            "left_s": round(self.left_s, 1),
        }


def bracket_search(
    evaluate: Callable[[float, str], Point],
    seed_qps: float,
    rule: BracketRule,
    expected_s: Callable[[float], float] = lambda qps: 0.0,
    elapsed_s: Callable[[], float] = lambda: 0.0,
    unit: str = "req/s",
) -> tuple[Answer, Stopped | None]:
    """Evaluate ``seed_qps``; step down (it missed the goals) or up (it met them) by
    ``rule.step`` (widening: :meth:`BracketRule.factor`) until a pass and a miss bracket the
    knee (``rule.max_steps`` at most), then
    bisect geometrically until high / low ≤ 1 + ``rule.bracket``.

    With ``rule.budget_s``, a rate is run only when ``elapsed_s() + expected_s(rate)`` fits in
    it; otherwise the search stops there, its answer is the bracket so far, and its note (and the
    returned :class:`Stopped`) say so. The goals are assumed to get harder with the rate."""
    evaluated: list[Point] = []
    stopped: Stopped | None = None

    def run(qps: float, phase: str) -> Point | None:
        nonlocal stopped
        if rule.budget_s:
            expected, left = expected_s(qps), rule.budget_s - elapsed_s()
            if expected > left:
                stopped = Stopped(qps, expected, left)
                return None
        point = evaluate(qps, phase)
        evaluated.append(point)
        return point

    low: float | None = None
    high: float | None = None
    first = run(rounded(seed_qps), "seed")
    if first is not None:
        low, high = (first.qps, None) if first.meets else (None, first.qps)
        for k in range(rule.max_steps):
            factor = rule.factor(k)
            if high is None and low is not None:  # up from the highest rate that met them
                qps = rounded(low * factor)
            elif low is None and high is not None:  # down from the lowest that missed them
                qps = rounded(high / factor)
            else:  # bracketed
                break
            point = run(qps, "step")
            if point is None:
                break
            if point.meets:
                low = point.qps
            else:
                high = point.qps
    while stopped is None and low is not None and high is not None and not rule.narrow(low, high):
        middle = rounded(math.sqrt(low * high))
        if not low < middle < high:
            break
        point = run(middle, "bisect")
        if point is None:
            break
        if point.meets:
            low = middle
        else:
            high = middle
    notes = _notes(evaluated, low, high, rule, unit)
    if stopped is not None:
        notes.append(stopped.sentence(rule.budget_s, unit))
    ordered = tuple(sorted(evaluated, key=lambda p: p.qps))
    bracket = (low if low is not None else 0.0, high)
    return Answer(low, bracket, ordered, "; ".join(notes)), stopped


def _notes(
    evaluated: list[Point],
    low: float | None,
    high: float | None,
    rule: BracketRule,
    unit: str,
) -> list[str]:
    """What the bracket says beyond its ends: no rate met the goals, none missed them, or the
    bracket is wider than the target."""
    if not evaluated:
        return ["no rate was run"]
    if low is None:
        return [f"even {high:g} {unit} missed the goals (the lowest rate tried)"]
    if high is None:
        return [f"{low:g} {unit} still met the goals (the highest rate tried)"]
    if not rule.narrow(low, high):
        return [
            f"the bracket {low:g}..{high:g} {unit} is wider than capacity.verify_bracket="
            f"{rule.bracket:g} asks"
        ]
    return []
