"""Each load simulated again at its real run's own step level, beside the simulation as
calibrated (issue 64, item 3): the model's error apart from the host's speed.

The simulation as calibrated is the answer a user gets; near the knee a few percent of host speed
move latency many times over, so a row can miss because the model is wrong or because the real
server ran its steps faster or slower than the calibration saw. Timing the real run's own steps
with the simulation's step model gives that server's level
(:func:`~gpu_simulate_test.orchestrate.step_level.real_step_level`); the load simulated with
every step's time times that level (``vidur.step_time_scale``; on the host's CPU the front end too,
``vidur.frontend_time_scale``) is what the model says once the host's speed is known. It reads
the judged run, so it is a diagnosis, never the answer: the verdict judges the simulation as
calibrated and shows this beside it, saying which is which.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.fidelity.tables import error_spread, has_at_level


def _levels(capacity: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, float, Any]]:
    return [
        (str(backend), float(load["load_fraction"]), load.get("real_step_level"))
        for backend, cap in capacity.items()
        for load in cap.get("loads", [])
    ]


def at_level_json(
    table: pd.DataFrame, capacity: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any] | None:
    """``fidelity.json`` ``at_real_step_level``: each load's level (``ratio``: the real run's busy
    steps over the model's for the same steps), and per backend and clock the spread of the
    errors as calibrated and at the level; None when no load has a level."""
    if not has_at_level(table):
        return None
    spreads: dict[str, Any] = {}
    for (backend, clock), part in table.groupby(["backend", "clock"], sort=False):
        spreads.setdefault(str(backend), {})[str(clock)] = {
            "as_calibrated": error_spread(part),
            "at_level": error_spread(part, "rel_error_at_level"),
        }
    return {
        "convention": (
            "each load simulated again with every step ratio times as long (its real run's busy "
            "steps over the step model's for the same steps), and where front_end is true (the "
            "engine on the host's CPU) its front end too; a diagnosis that reads the judged "
            "run, never the answer"
        ),
        "levels": [
            {
                "backend": b,
                "load_fraction": f,
                "ratio": None if lv is None else lv.get("ratio"),
                "front_end": None if lv is None else lv.get("front_end"),
            }
            for b, f, lv in _levels(capacity)
        ],
        "spread_by_clock": spreads,
    }


def _pct(value: Any) -> str:
    return "–" if value is None or not np.isfinite(float(value)) else f"{float(value):+.1f}%"


def at_level_lines(table: pd.DataFrame, capacity: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The report's section: each load's real step level, and per backend and clock the rows
    within 10%, the median absolute error and the mean signed error, as calibrated and at the
    level; nothing when no load has a level."""
    record = at_level_json(table, capacity)
    if record is None:
        return []
    levels = ", ".join(
        f"{b} {f:.0%}: {'–' if lv is None else f'{float(lv):.2f}×'}"
        for b, f, lv in ((x["backend"], x["load_fraction"], x["ratio"]) for x in record["levels"])
    )
    lines = [
        "",
        "## At the real runs' own step level",
        "",
        "Each load simulated again with every step's time times the factor its real run's steps "
        "took against the simulation's step model (a level above 1: the server ran slower than "
        "the calibration; below 1, faster), and where the engine runs on the host's CPU, whose "
        "cores the API server shares, its front end by the same factor. As calibrated is the "
        "answer; at the level is the model's error once the host's speed is known (it reads the "
        "judged run: a diagnosis, not the answer).",
        "",
        f"Levels: {levels}.",
        "",
        "| backend | clock | rows | within 10%: as calibrated | at the level "
        "| median abs: as calibrated | at the level | mean signed: as calibrated | at the level |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for backend, clocks in record["spread_by_clock"].items():
        for clock, pair in clocks.items():
            was, now = pair["as_calibrated"], pair["at_level"]
            lines.append(
                f"| {backend} | {clock} | {was['rows']} | {was['within_10pct']} | "
                f"{now['within_10pct']} of {now['rows']} | {was['median_abs_error_pct']:.1f}% | "
                f"{now['median_abs_error_pct']:.1f}% | {_pct(was['mean_signed_error_pct'])} | "
                f"{_pct(now['mean_signed_error_pct'])} |"
            )
    return lines
