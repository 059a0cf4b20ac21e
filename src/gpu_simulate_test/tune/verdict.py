"""The tune's verdict, first in its report and on the terminal: what it recommends, what the real
check measured, and what that check can and cannot say.

Two rules keep the check honest (issue 64):

- **It judges the ranking whose picks it measured.** ``tune.verify=top_k`` measures the top picks
  of the first calibration's ranking; when the tune calibrates again after the check
  (``tune.recalibrate``) and adopts the new calibration, the new ranking may put configurations
  on top that were never measured. The check then judges the first ranking (each checked row's
  ``first_calibration_qps``) and says so; the recommendation, from the adopted ranking, is said
  to be measured or not.
- **It names no winner inside the spread between servers.** Two fresh servers of one engine
  differ (``tune.server_spread``); the configurations whose measured capacity is within that
  share of the best's are tied (``tied_best``), and the simulated top 2 agrees with the check
  when it holds any of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def _order_key(row: Mapping[str, Any], first: bool) -> float:
    value = row.get("first_calibration_qps") if first else None
    value = row.get("simulated_qps") if value is None else value
    return -(float(value) if value is not None else -1.0)


def judged(rows: Sequence[Mapping[str, Any]], spread: float) -> dict[str, Any]:
    """The check's judgement of ``rows`` (``verify.configs``): ``judged_ranking`` (``first
    calibration`` after an adopted recalibration, else ``simulation``), ``judged_top2`` under
    it, ``tied_best`` (measured within ``spread`` of the best, best first), ``server_spread``,
    ``winner`` (None for a tie or nothing measured) and ``agrees`` (the judged top 2 holds a
    tied best; None when nothing was measured)."""
    first = any(row.get("first_calibration_qps") is not None for row in rows)
    order = sorted(rows, key=lambda row: _order_key(row, first))
    top2 = [str(row["config_id"]) for row in order[:2]]
    measured = sorted(
        (row for row in rows if row.get("measured_qps") is not None),
        key=lambda row: -float(row["measured_qps"]),
    )
    tied: list[str] = []
    if measured:
        floor = float(measured[0]["measured_qps"]) / (1.0 + spread)
        tied = [str(r["config_id"]) for r in measured if float(r["measured_qps"]) >= floor]
    return {
        "judged_ranking": "first calibration" if first else "simulation",
        "judged_top2": top2,
        "tied_best": tied,
        "server_spread": spread,
        "winner": tied[0] if len(tied) == 1 else None,
        "agrees": bool(set(tied) & set(top2)) if tied else None,
    }


def _qps(value: Any) -> str:
    return "–" if value is None else f"{float(value):.3g}"


def no_best_said(doc: Mapping[str, Any]) -> str:
    """Why ``tune.json`` recommends nothing: no configuration meets the goals, or (with
    ``tune.target_qps``) none reaches the target rate, though some meet the goals below it."""
    target = doc.get("target") or {}
    if target and not target.get("config_id") and target.get("note"):
        rate = f"{target['target_qps']:g}"
        return f"No configuration reaches tune.target_qps={rate}: {target['note']}"
    return f"No configuration meets the goals: {doc.get('note', '')}".rstrip(": ")


def verdict_lines(doc: Mapping[str, Any]) -> list[str]:
    """The verdict, a few plain lines (``tune.json``'s document): the recommendation, the
    check's best (or its tie, with the spread), whether the recommendation was measured, and
    which ranking the check judged."""
    best = doc.get("best")
    objective = doc.get("objective", "capacity")
    if not best:
        return [no_best_said(doc)]
    lines = [
        f"Recommended: {best['config_id']} (simulated {objective} {_qps(best.get('score'))} "
        f"req/s, the configured backend {_qps(doc.get('configured_score'))})."
    ]
    verified = doc.get("verify")
    if not verified:
        return [*lines, "Not checked on the real engine (tune.verify=false): simulated only."]
    if "tied_best" not in verified:  # a tune.json written before the verdict: judged now
        from gpu_simulate_test.config.tune import TuneOptions

        verified = {**verified, **judged(verified.get("configs", []), TuneOptions.server_spread)}
    rows = {str(r["config_id"]): r for r in verified.get("configs", [])}
    tied = list(verified.get("tied_best") or [])
    spread = float(verified.get("server_spread") or 0.0)
    if not tied:
        lines.append(f"The real check measured no capacity ({len(rows)} configuration(s) tried).")
        return lines
    measured = ", ".join(f"{c} {_qps(rows[c]['measured_qps'])}" for c in tied)
    if len(tied) > 1:
        lines.append(
            f"Measured on real servers ({len(rows)} configurations): a tie, no winner — {measured}"
            f" req/s are within the spread between servers ({spread:.0%})."
        )
    else:
        others = [r for c, r in rows.items() if c != tied[0] and r.get("measured_qps")]
        nxt = max((float(r["measured_qps"]) for r in others), default=None)
        gap = (
            ""
            if nxt is None
            else f", {float(rows[tied[0]]['measured_qps']) / nxt - 1:.0%} above the next "
            f"(outside the {spread:.0%} spread between servers)"
        )
        lines.append(
            f"Measured on real servers ({len(rows)} configurations): best {measured} req/s{gap}."
        )
    mine = rows.get(str(best["config_id"]))
    if mine is None or mine.get("measured_qps") is None:
        lines.append(
            f"The recommendation was not measured (the {verified.get('judged_ranking')}'s "
            "picks were): take it as simulated."
        )
    else:
        where = "among the measured best" if best["config_id"] in tied else "not the measured best"
        lines.append(f"The recommendation measured {_qps(mine['measured_qps'])} req/s ({where}).")
    agrees = verified.get("agrees")
    said = {True: "holds", False: "does NOT hold", None: "cannot be compared with"}[agrees]
    lines.append(
        f"Judged: the {verified.get('judged_ranking')}'s ranking (its picks were the ones "
        f"measured); its top 2 ({', '.join(verified.get('judged_top2') or [])}) {said} "
        + ("a tied best." if len(tied) > 1 else "the measured best.")
    )
    return lines
