"""The comparison's verdict, first in ``summary.md``: which figures are within the truth's own
spread and which are not, the largest gap and its cause, and whether the truth was disturbed.

A figure (TTFT, TPOT, E2E at p50 and p90, on each clock) is **within the noise** when the
simulation's error against the real run is at most ``max(10%, |real vs real|)``: the truth's
own run-to-run difference on the same clock (a second real run of the workload), or 10% where
there is no second run. p99 is left to the tables: at 40 requests it is one request.

The cause of the largest gap is named from what the comparison measured: on the client's clock
where the engine's clock of the same figure is within the noise, the front end (client −
engine); otherwise the engine's steps (their time at the same compositions, or their number).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.comparison import Comparison
from gpu_simulate_test.core.host.disturbance import NOT_JUDGED
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, read_json

NOISE_FLOOR = 0.10
"""An error within this is within the noise whatever the truth's repeat says."""
JUDGED_METRICS: tuple[str, ...] = ("ttft", "tpot", "e2e")
JUDGED_STATS: tuple[str, ...] = ("p50", "p90")
SHOWN_OUTSIDE = 3
"""Figures the verdict's line names outside the noise, furthest first (``comparison.json``
``verdict.outside`` has them all)."""


@dataclass(frozen=True)
class Figure:
    """One judged figure: the simulation's error on one clock, and the band it is judged in."""

    clock: str
    metric: str
    stat: str
    error: float
    noise: float | None
    """The truth's own difference (repeat / real − 1) on this clock; None without a repeat."""

    @property
    def band(self) -> float:
        return max(NOISE_FLOOR, abs(self.noise)) if self.noise is not None else NOISE_FLOOR

    @property
    def within(self) -> bool:
        return abs(self.error) <= self.band

    @property
    def name(self) -> str:
        return f"{self.clock} {m.METRIC_LABELS.get(self.metric, self.metric)} {self.stat}"

    def text(self) -> str:
        noise = f"real vs real {self.noise:+.1%}" if self.noise is not None else "no repeat"
        return f"{self.name} {self.error:+.1%} ({noise})"

    def to_dict(self) -> dict[str, Any]:
        return {
            "clock": self.clock,
            "metric": self.metric,
            "stat": self.stat,
            "error": self.error,
            "real_vs_real": self.noise,
            "band": self.band,
            "within_noise": self.within,
        }


def _number(value: Any) -> float | None:
    """``value`` as a finite float, else None."""
    if isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def figures(clocks: Sequence[Mapping[str, Any]] | None, comparison: Comparison) -> list[Figure]:
    """Every judged figure: both clocks from the clocks table; the client's alone (from the
    latency table) where the real run has no engine clock."""
    if clocks:
        return clock_figures(clocks, "error")
    found: list[Figure] = []
    for item in comparison.metrics:
        if item.metric not in JUDGED_METRICS or not item.available_sim:
            continue
        for e in item.errors:
            error = _number(e.signed_rel_error)
            if e.stat in JUDGED_STATS and error is not None:
                found.append(Figure("client", item.metric, e.stat, error, None))
    return found


def clock_figures(clocks: Sequence[Mapping[str, Any]] | None, error: str) -> list[Figure]:
    """The judged figures of the clocks table on both clocks, each read from its row's
    ``<error>_vs_<clock>`` (``error``: the main simulation's; ``pooled``: every seed's requests
    pooled, where the comparison had the simulation's other seeds) in the band of the truth's
    own difference on that clock."""
    found: list[Figure] = []
    for clock in ("engine", "client"):
        for row in clocks or ():
            if row["metric"] not in JUDGED_METRICS or row["stat"] not in JUDGED_STATS:
                continue
            value = _number(row.get(f"{error}_vs_{clock}"))
            if value is not None:
                noise = _number(row.get(f"noise_vs_{clock}"))
                found.append(Figure(clock, row["metric"], row["stat"], value, noise))
    return found


def seeds_line(record: Mapping[str, Any]) -> str | None:
    """What the verdict says of the simulation's other seeds (None without them): reported,
    never the verdict."""
    pooled = record.get("pooled")
    if not pooled:
        return None
    return (
        f"**Over its {pooled['seeds']} seeds:** every seed's requests pooled, "
        f"{pooled['within']} of {pooled['judged']} figures within the same bands "
        "(reported, not judged)"
    )


def at_level_line(record: Mapping[str, Any]) -> str | None:
    """What the verdict says of the simulation at the real run's step level (None without it):
    a diagnosis that reads the judged run, never the verdict."""
    at = record.get("at_level")
    if not at:
        return None
    ratio = at.get("ratio")
    steps = f"the real steps {ratio:.3f}× the model's; " if isinstance(ratio, float) else ""
    return (
        f"**At the real run's step level** ({steps}a diagnosis, not judged): "
        f"{at['within']} of {at['judged']} figures within the same bands"
    )


def largest_gap(judged: Sequence[Figure]) -> Figure | None:
    """The figure furthest outside its band (the largest error when every one is within)."""
    if not judged:
        return None
    return max(judged, key=lambda f: (not f.within, abs(f.error) - f.band))


def cause(
    gap: Figure,
    judged: Sequence[Figure],
    clocks: Sequence[Mapping[str, Any]] | None,
    steps: Mapping[str, Any] | None,
) -> str:
    """What the comparison says made ``gap``: the front end where the engine's clock of the
    same figure is within the noise and the front end's gap is the larger part of the client's,
    else the engine's steps (time or number, the larger)."""
    twin = next(
        (f for f in judged if f.clock == "engine" and (f.metric, f.stat) == (gap.metric, gap.stat)),
        None,
    )
    row = next(
        (r for r in clocks or () if (r["metric"], r["stat"]) == (gap.metric, gap.stat)), None
    )
    if gap.clock == "client" and twin is not None and twin.within and row and _front_leads(row):
        return (
            f"the front end (client − engine): {1e3 * row['front_end_s']:.1f} ms real against "
            f"{1e3 * row['sim_front_end_s']:.1f} ms simulated; the engine's clock is within "
            f"the noise ({twin.error:+.1%})"
        )
    if not steps:
        return "no engine step record to say whether the steps' time or their number"
    time_error = _number(steps.get("step_time_error"))
    count_error = _number(steps.get("step_count_error"))
    real, sim = steps.get("real") or {}, steps.get("sim") or {}
    if time_error is not None and (count_error is None or abs(time_error) >= abs(count_error)):
        return (
            f"the engine's step time: simulated steps {time_error:+.1%} against the real ones "
            "of the same compositions (Engine steps)"
        )
    if count_error is not None:
        return (
            f"the engine's scheduling: {sim.get('steps')} simulated steps against "
            f"{real.get('steps')} real ({count_error:+.1%}; Engine steps, Step by step)"
        )
    return "the step comparison measured neither the steps' time nor their number"


def _front_leads(row: Mapping[str, Any]) -> bool:
    """Whether the front end's gap (simulated − real, seconds) is at least the engine's in a
    client figure: a TPOT 1.2 ms short on the engine and 0.1 ms on the front end is the engine's
    (true where either is not known)."""
    try:
        engine = float(row["sim_engine_s"]) - float(row["engine_s"])
        front = float(row["sim_front_end_s"]) - float(row["front_end_s"])
    except (KeyError, TypeError, ValueError):
        return True
    if not (math.isfinite(engine) and math.isfinite(front)):
        return True
    return abs(front) >= abs(engine)


@dataclass(frozen=True)
class RunState:
    """One real run's disturbance verdict, as the real bench recorded it."""

    role: str
    name: str
    disturbed: bool
    reasons: tuple[str, ...]
    unjudged: str = ""
    """Why nobody judged the run (its record's ``note``, e.g. an import from a tool that records
    no signs of disturbance); empty when it was judged."""


def run_state(role: str, run_dir: Path | str) -> RunState:
    """``run_dir``'s verdict (``run_meta.json`` ``disturbance``; none recorded: undisturbed;
    a note saying it was not judged: :attr:`RunState.unjudged`)."""
    path = Path(run_dir)
    try:
        meta = json.loads((path / layout.RUN_META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        meta = {}
    record = meta.get("disturbance") or {}
    note = str(record.get("note") or "")
    return RunState(
        role,
        path.name,
        bool(record.get("disturbed", False)),
        tuple(record.get("reasons", ())),
        note.removeprefix(NOT_JUDGED) if note.startswith(NOT_JUDGED) else "",
    )


def check_replaced(run_dir: Path | str) -> None:
    """Fail unless ``run_dir`` is a real_bench run (complete or not: a disturbed attempt)."""
    path = Path(run_dir)
    if not path.is_dir():
        raise ArtifactError(f"replaced_runs: {path} does not exist; expected a real_bench run")
    stage = read_json(path / layout.RUN_META, required_keys=("stage",))["stage"]
    if stage != "real_bench":
        raise ArtifactError(f"replaced_runs: {path} is a {stage} run, expected a real_bench run")


def disturbance_line(runs: Sequence[RunState], replaced: Sequence[RunState]) -> str:
    """One line: every judged real run undisturbed, or which stayed disturbed and why; the
    disturbed runs that re-runs replaced."""
    redone = ""
    if replaced:
        names = ", ".join(f"`{r.name}`" for r in replaced)
        redone = f" {len(replaced)} disturbed run(s) replaced by a re-run ({names})."
    marked = [r for r in runs if r.disturbed]
    unjudged = [r for r in runs if r.unjudged and not r.disturbed]
    if unjudged and not marked:
        why = "; ".join(f"the {r.role}: {r.unjudged}" for r in unjudged)
        calm = [f"the {r.role}" for r in runs if not r.unjudged]
        rest = f" ({' and '.join(calm)} undisturbed)" if calm else ""
        return f"**Truth:** not judged for disturbance ({why}){rest}.{redone}"
    if not marked:
        said = " and ".join(f"the {r.role}" for r in runs)
        return f"**Truth:** {said} undisturbed.{redone}"
    said = "; ".join(f"the {r.role} `{r.name}`: {'; '.join(r.reasons)}" for r in marked)
    return (
        f"**Truth: DISTURBED**, judged anyway and marked: {said}. Its figures carry the host's "
        f"disturbance, not only the model's error.{redone}"
    )


def verdict(
    comparison: Comparison,
    clocks: Sequence[Mapping[str, Any]] | None,
    steps: Mapping[str, Any] | None,
    runs: Sequence[RunState],
    replaced: Sequence[RunState] = (),
    at_level_ratio: float | None = None,
) -> dict[str, Any]:
    """``comparison.json`` ``verdict``: each judged figure, the largest gap and its cause, the
    real runs' disturbance; beside them, reported, the simulation's other seeds pooled and the
    simulation at the real run's step level (``at_level_ratio``: its level)."""
    judged = figures(clocks, comparison)
    gap = largest_gap(judged)
    pooled = clock_figures(clocks, "pooled")
    at_level = clock_figures(clocks, "at_level")
    seeds = 1 + max((len(r.get("seeds_sim_s") or []) for r in clocks or ()), default=0)
    return {
        "rule": f"|error| <= max({NOISE_FLOOR:.0%}, |real vs real|) on the same clock",
        "figures": [f.to_dict() for f in judged],
        "within": sum(f.within for f in judged),
        "judged": len(judged),
        "outside": [
            f.text()
            for f in sorted(judged, key=lambda f: f.band - abs(f.error))  # furthest out first
            if not f.within
        ],
        "largest_gap": None if gap is None else gap.text(),
        "cause": None if gap is None else cause(gap, judged, clocks, steps),
        "disturbed": [r.name for r in runs if r.disturbed],
        "truth": disturbance_line(runs, replaced),
        "repeat": any(f.noise is not None for f in judged),
        "pooled": (
            {"seeds": seeds, "within": sum(f.within for f in pooled), "judged": len(pooled)}
            if pooled
            else None
        ),
        "at_level": (
            {
                "ratio": at_level_ratio,
                "within": sum(f.within for f in at_level),
                "judged": len(at_level),
                "figures": [f.to_dict() for f in at_level],
            }
            if at_level
            else None
        ),
    }


def verdict_markdown(record: Mapping[str, Any]) -> list[str]:
    """The verdict's lines (three, one more with the simulation's other seeds and one with it
    at the real run's step level, and an empty one), for the top of ``summary.md``."""
    if not record["judged"]:
        return ["- **Verdict:** no figure could be judged (no simulated latency).", ""]
    band = "max(10%, real vs real)" if record["repeat"] else "10% (no repeat of the truth)"
    head = f"**Verdict:** {record['within']} of {record['judged']} figures within {band}"
    outside = record["outside"]
    more = f"; and {len(outside) - SHOWN_OUTSIDE} more" if len(outside) > SHOWN_OUTSIDE else ""
    named = "; ".join(outside[:SHOWN_OUTSIDE])
    head += f". Outside, furthest first: {named}{more}." if outside else ": every one."
    lines = [head]
    if record["largest_gap"]:
        lines.append(f"**Largest gap:** {record['largest_gap']}: {record['cause']}.")
    for extra in (seeds_line(record), at_level_line(record)):
        if extra is not None:
            lines.append(f"{extra}.")
    lines.append(record["truth"])
    return [*(f"- {line}" for line in lines), ""]
