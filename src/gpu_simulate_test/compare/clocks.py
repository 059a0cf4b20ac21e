"""Two clocks: the simulation against the engine's own clock first, the client's beside it.

A backend with an engine clock (``vllm_engine``, ``hf_cb``) records per request when the engine
received it and produced its first and last token (``engine_*`` columns of
``request_metrics``): that is what Vidur models. The client's clock adds the front end (HTTP,
the API server, streaming). The comparison shows both, never mixed: per metric and statistic,
the engine's figure, the client's, the simulated one, the simulation's error against each, and
the front end (client − engine). Without an engine clock there is no table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.core.reporting import markdown_table

ENGINE_COLUMNS: dict[str, str] = {
    "ttft": "engine_ttft_s",
    "tpot": "engine_tpot_s",
    "e2e": "engine_e2e_s",
}
"""Each compared metric's engine-clock column."""
CLOCK_STATS: tuple[str, ...] = ("p50", "p90", "p99")


def clock_rows(real: pd.DataFrame, joined: m.JoinedRequests) -> list[dict[str, Any]] | None:
    """Per metric and statistic (seconds): engine, client, simulated, the errors against each
    clock and the front end; None when the real run has no engine clock for these requests."""
    frame = real.set_index("request_id").reindex(joined.request_id)
    rows: list[dict[str, Any]] = []
    for metric, column in ENGINE_COLUMNS.items():
        if column not in frame.columns:
            return None
        engine = m.distribution(pd.to_numeric(frame[column], errors="coerce").to_numpy(float))
        if engine.count == 0:
            return None
        client = m.distribution(joined.real.metric(metric))
        sim = m.distribution(joined.sim.metric(metric))
        for stat in CLOCK_STATS:
            e, c, s = (float(getattr(d, stat)) for d in (engine, client, sim))
            rows.append(
                {
                    "metric": metric,
                    "stat": stat,
                    "engine_s": e,
                    "client_s": c,
                    "sim_s": s,
                    "error_vs_engine": m.relative_error(s, e),
                    "error_vs_client": m.relative_error(s, c),
                    "front_end_s": c - e if np.isfinite(c) and np.isfinite(e) else float("nan"),
                }
            )
    return rows


def clocks_markdown(rows: list[dict[str, Any]] | None) -> str:
    """The ``summary.md`` section (empty without an engine clock)."""
    if not rows:
        return ""

    def ms(value: float) -> str:
        return f"{value * 1e3:.2f}" if np.isfinite(value) else "n/a"

    def pct(value: float) -> str:
        return f"{value:+.1%}" if np.isfinite(value) else "n/a"

    table = markdown_table(
        ["metric", "stat", "engine", "client", "simulated", "sim vs engine", "sim vs client",
         "front end"],
        [
            [m.METRIC_LABELS[r["metric"]], r["stat"], ms(r["engine_s"]), ms(r["client_s"]),
             ms(r["sim_s"]), pct(r["error_vs_engine"]), pct(r["error_vs_client"]),
             ms(r["front_end_s"])]
            for r in rows
        ],
    )  # fmt: skip
    return (
        "\n## Two clocks (ms)\n\nThe engine's own clock (what Vidur models) first; the client's "
        "adds the front end (front end = client − engine).\n\n" + table + "\n"
    )
