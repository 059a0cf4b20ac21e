"""The simulation again at the real run's own step level, beside the one as calibrated
(``compare.at_level_dir``): the model's error apart from the host's speed.

The simulation runs its steps at the speed its calibration saw; the real run may have run them
faster or slower minutes later (fresh servers on this host differ by about 15%, and on 40 main
jobs the real run's steps over the model's for the same steps spread 0.82–1.14, sd 0.06, mean
1.00: benchmarks/results/main_at_level_20261205). Simulated again with every step that much
longer (``vidur.step_time_scale``: the pipeline's ``<run_id>-at-level``,
:func:`~gpu_simulate_test.orchestrate.step_level.simulate_at_level`), the same arrivals say
how far the model is off once the host's speed is known. It reads the judged run, so it is a
diagnosis, never the answer: the verdict judges the simulation as calibrated and says this
beside it, naming which is which (as the fidelity stage's ``rel_error_at_level`` does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.compare.clocks import sim_engine_metric
from gpu_simulate_test.compare.seeds import SeedRun, seed_run
from gpu_simulate_test.core.reporting import markdown_table
from gpu_simulate_test.core.run_inputs import RunInput, load_run

AT_LEVEL = "at_level"
"""The clocks rows' prefix of the simulation at the real run's level (``at_level_sim_s``,
``at_level_sim_engine_s``, ``at_level_vs_engine``, ``at_level_vs_client``)."""


@dataclass(frozen=True)
class AtLevelRun:
    """The workload simulated at the real run's step level, joined to the real requests."""

    run: SeedRun
    ratio: float | None
    """Its ``vidur.step_time_scale``: the real run's busy steps over the step model's for the
    same steps (None where its run_meta does not say)."""
    front_end_scale: float = 1.0
    """Its ``vidur.frontend_time_scale``: the front end scaled with the steps where the engine
    shares the host's CPU (1: as calibrated)."""


def load_at_level(
    path: str | None, real: RunInput, real_requests: pd.DataFrame
) -> AtLevelRun | None:
    """The vidur_simulate run at ``path`` (of ``real``'s workload, checked as a seed's run is:
    :func:`~.seeds.seed_run`),
    or None without one."""
    if not path:
        return None
    run = load_run(path, "vidur_simulate")
    vidur = run.meta.get("config", {}).get("vidur", {})
    ratio, front = vidur.get("step_time_scale"), vidur.get("frontend_time_scale", 1.0)
    return AtLevelRun(
        seed_run(run, real, real_requests),
        float(ratio) if isinstance(ratio, int | float) else None,
        float(front) if isinstance(front, int | float) else 1.0,
    )


def with_at_level(
    rows: list[dict[str, Any]] | None, at: AtLevelRun | None
) -> list[dict[str, Any]] | None:
    """The clocks rows with, per row, the simulation at the real run's level on both clocks and
    its errors (:data:`AT_LEVEL` columns); the rows as they are without it."""
    if not rows or at is None:
        return rows
    values: dict[tuple[str, str], tuple[float, float]] = {}
    for metric in {r["metric"] for r in rows}:
        client = m.distribution(at.run.joined.sim.metric(metric))
        engine = m.distribution(sim_engine_metric(at.run.requests, at.run.joined, metric))
        for stat in {r["stat"] for r in rows if r["metric"] == metric}:
            values[metric, stat] = float(getattr(client, stat)), float(getattr(engine, stat))
    out = []
    for row in rows:
        client_s, engine_s = values[row["metric"], row["stat"]]
        out.append(
            {
                **row,
                f"{AT_LEVEL}_sim_s": client_s,
                f"{AT_LEVEL}_sim_engine_s": engine_s,
                f"{AT_LEVEL}_vs_engine": m.relative_error(engine_s, row["engine_s"]),
                f"{AT_LEVEL}_vs_client": m.relative_error(client_s, row["client_s"]),
            }
        )
    return out


def at_level_json(at: AtLevelRun | None) -> dict[str, Any] | None:
    """``comparison.json`` ``at_real_step_level``: the run, its level and what it is."""
    if at is None:
        return None
    return {
        "sim_run_dir": str(at.run.path),
        "ratio": at.ratio,
        "frontend_time_scale": at.front_end_scale,
        "convention": (
            "the same arrivals simulated with every step ratio times as long (the real run's "
            "busy steps over the step model's for the same steps), and the front end "
            "frontend_time_scale times (the level where the engine shares the host's CPU, else "
            "1); the clocks rows' at_level_* columns; a diagnosis that reads the judged run, "
            "never the answer"
        ),
    }


def level_text(ratio: float | None, front_end_scale: float = 1.0) -> str:
    """How the real run's steps stood to the model's, in words (and the front end, where it was
    scaled with them)."""
    said = [] if ratio is None else [f"the real steps {ratio:.3f}× the model's"]
    if front_end_scale != 1.0:
        said.append(f"the front end {front_end_scale:.3f}× too")
    return "at its real run's step level" + (f" ({', '.join(said)})" if said else "")


def at_level_markdown(rows: Sequence[Mapping[str, Any]] | None, at: AtLevelRun | None) -> str:
    """The ``summary.md`` section: per figure on both clocks the error as calibrated and at the
    real run's level (empty without the run or an engine clock)."""
    if not rows or at is None or f"{AT_LEVEL}_vs_client" not in rows[0]:
        return ""

    def pct(value: Any) -> str:
        return f"{value:+.1%}" if isinstance(value, float) and np.isfinite(value) else "n/a"

    header = ["metric", "stat", "engine: as calibrated", "at the level", "real vs real",
              "client: as calibrated", "at the level", "real vs real"]  # fmt: skip
    body = [
        [m.METRIC_LABELS[r["metric"]], r["stat"]]
        + [
            pct(r.get(key))
            for clock in ("engine", "client")
            for key in (f"error_vs_{clock}", f"{AT_LEVEL}_vs_{clock}", f"noise_vs_{clock}")
        ]
        for r in rows
    ]
    return (
        "\n## At the real run's step level (a diagnosis)\n\n"
        f"The same arrivals simulated again {level_text(at.ratio, at.front_end_scale)}: every "
        "step's time times that factor (`vidur.step_time_scale`; on the host's CPU, whose cores "
        "the API server shares, the front end too: `vidur.frontend_time_scale`; "
        f"`{at.run.path.name}`). As calibrated is the answer; at the level, how far the model "
        "is off once the host's speed is known. It reads the judged run, so it is never the "
        "answer (docs/compare.md, *At the real run's step level*).\n\n"
        + markdown_table(header, body)
        + "\n"
    )
