"""Two clocks: the simulation against the engine's own clock first, the client's beside it.

A backend with an engine clock (``vllm_engine``, ``hf_cb``) records per request when the engine
received it and produced its first and last token (``engine_*`` columns of
``request_metrics``): that is what Vidur models. The client's clock adds the front end (HTTP,
the API server, streaming). The comparison shows both, never mixed: per metric and statistic,
the engine's figure, the client's, the simulated one, the simulation's error against each, and
the front end (client − engine). Without an engine clock there is no table.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.compare import metrics as m
from gpu_simulate_test.core.reporting import markdown_table

ENGINE_COLUMNS: Mapping[str, str] = MappingProxyType(
    {
        "ttft": "engine_ttft_s",
        "tpot": "engine_tpot_s",
        "e2e": "engine_e2e_s",
    }
)
"""Each compared metric's engine-clock column."""
CLOCK_STATS: tuple[str, ...] = ("p50", "p90", "p99")


def sim_engine_metric(
    sim: pd.DataFrame | None, joined: m.JoinedRequests, metric: str
) -> np.ndarray:
    """The simulated engine's own clock of ``metric`` for the joined requests: TTFT and E2E
    without the front-end delay the simulation added (``frontend_delay_s``; none added where
    the run has no such column). Where the run splits the first and the last token's way back
    (``frontend_first_token_s``, ``frontend_last_token_s``: the front end as a queue delivers
    them apart), E2E less the last token's instead of the first's, and TPOT less the
    difference spread over the later tokens; else TPOT as it is (a difference of token
    times)."""
    values = joined.sim.metric(metric)
    if sim is None or "frontend_delay_s" not in sim.columns:
        return values
    frame = sim.set_index("request_id").reindex(joined.request_id)

    def column(name: str) -> np.ndarray:
        if name not in frame.columns:
            return np.full(len(frame), np.nan)
        return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float)

    apart = np.nan_to_num(column("frontend_last_token_s") - column("frontend_first_token_s"))
    if metric == "tpot":
        later = np.asarray(joined.num_decode_tokens, dtype=float) - 1.0
        return values - np.divide(apart, later, out=np.zeros(len(apart)), where=later > 0)
    delay = np.nan_to_num(column("frontend_delay_s"))
    return values - (delay + apart if metric == "e2e" else delay)


def repeat_values(frame: pd.DataFrame, column: str) -> np.ndarray:
    """A repeated real run's ``column`` (its ``request_metrics`` reindexed to the joined
    requests), NaN where that request did not complete there (or the column is missing)."""
    if column not in frame.columns:
        return np.full(len(frame), np.nan)
    values = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    return np.where((frame["status"] == "ok").to_numpy(), values, np.nan)


def clock_rows(
    real: pd.DataFrame,
    joined: m.JoinedRequests,
    sim: pd.DataFrame | None = None,
    repeat: pd.DataFrame | None = None,
) -> list[dict[str, Any]] | None:
    """Per metric and statistic (seconds): engine, client, simulated on each clock (the
    simulated engine's without its front-end delay: :func:`sim_engine_metric`), the errors
    against each clock, and the front end real and simulated; None when the real run has no
    engine clock for these requests. Clocks are never mixed: the simulation's engine clock is
    judged against the engine's, its client clock against the client's.

    With ``repeat`` (a second real run of the same workload, its ``request_metrics``): the same
    requests there on each clock and the truth's run-to-run difference, ``noise_vs_engine`` and
    ``noise_vs_client`` (repeat / real − 1): the noise floor beside the simulator's error."""
    frame = real.set_index("request_id").reindex(joined.request_id)
    again_frame = None
    if repeat is not None:
        again_frame = repeat.set_index("request_id").reindex(joined.request_id)
    rows: list[dict[str, Any]] = []
    for metric, column in ENGINE_COLUMNS.items():
        if column not in frame.columns:
            return None
        engine = m.distribution(pd.to_numeric(frame[column], errors="coerce").to_numpy(float))
        if engine.count == 0:
            return None
        client = m.distribution(joined.real.metric(metric))
        simulated = m.distribution(joined.sim.metric(metric))
        sim_engine = m.distribution(sim_engine_metric(sim, joined, metric))
        again = None
        if again_frame is not None:  # the client's column: ``<metric>_s``, as everywhere
            again = (
                m.distribution(repeat_values(again_frame, column)),
                m.distribution(repeat_values(again_frame, f"{metric}_s")),
            )
        for stat in CLOCK_STATS:
            e, c, s, se = (float(getattr(d, stat)) for d in (engine, client, simulated, sim_engine))
            noise = {}
            if again is not None:
                re, rc = (float(getattr(d, stat)) for d in again)
                noise = {
                    "repeat_engine_s": re,
                    "repeat_client_s": rc,
                    "noise_vs_engine": m.relative_error(re, e),
                    "noise_vs_client": m.relative_error(rc, c),
                }
            rows.append(
                {
                    "metric": metric,
                    "stat": stat,
                    "engine_s": e,
                    "client_s": c,
                    "sim_s": s,
                    "sim_engine_s": se,
                    "error_vs_engine": m.relative_error(se, e),
                    "error_vs_client": m.relative_error(s, c),
                    "front_end_s": c - e if np.isfinite(c) and np.isfinite(e) else float("nan"),
                    "sim_front_end_s": s - se,
                    **noise,
                }
            )
    return rows


def clocks_markdown(rows: list[dict[str, Any]] | None, seeds_note: str = "") -> str:
    """The ``summary.md`` section (empty without an engine clock); with the seeds' ranges
    (:func:`~.seeds.with_seeds`) a column per clock and ``seeds_note`` saying what it is."""
    if not rows:
        return ""

    def ms(value: float) -> str:
        return f"{value * 1e3:.2f}" if np.isfinite(value) else "n/a"

    def pct(value: float) -> str:
        return f"{value:+.1%}" if np.isfinite(value) else "n/a"

    def spread(values: list[float], pooled: float | None) -> str:
        text = f"{pct(values[0])}..{pct(values[1])}"
        return text if pooled is None else f"{text}, pooled {pct(pooled)}"

    repeated = "noise_vs_engine" in rows[0]
    seeded = "seeds_vs_engine" in rows[0]
    header = ["metric", "stat", "engine", "simulated engine", "sim vs engine"]
    header += ["over its seeds (engine)"] if seeded else []
    header += ["real vs real (engine)"] if repeated else []
    header += ["client", "simulated client", "sim vs client"]
    header += ["over its seeds (client)"] if seeded else []
    header += ["real vs real (client)"] if repeated else []
    header += ["front end", "simulated front end"]
    body = []
    for r in rows:
        line = [m.METRIC_LABELS[r["metric"]], r["stat"], ms(r["engine_s"]), ms(r["sim_engine_s"]),
                pct(r["error_vs_engine"])]  # fmt: skip
        line += [spread(r["seeds_vs_engine"], r.get("pooled_vs_engine"))] if seeded else []
        line += [pct(r["noise_vs_engine"])] if repeated else []
        line += [ms(r["client_s"]), ms(r["sim_s"]), pct(r["error_vs_client"])]
        line += [spread(r["seeds_vs_client"], r.get("pooled_vs_client"))] if seeded else []
        line += [pct(r["noise_vs_client"])] if repeated else []
        line += [ms(r["front_end_s"]), ms(r["sim_front_end_s"])]
        body.append(line)
    noise = (
        " *Real vs real*: a second real run of the same workload against the first (repeat / "
        "first − 1), the truth's own run-to-run difference: a simulator error within it is "
        "within the noise."
        if repeated
        else ""
    )
    return (
        "\n## Two clocks (ms)\n\nThe engine's own clock (what Vidur models) first, the simulated "
        "engine's beside it (without the front-end delay the simulation adds); then the client's "
        "clock, real and simulated, with the front end (client − engine)."
        + noise
        + (seeds_note if seeded else "")
        + "\n\n"
        + markdown_table(header, body)
        + "\n"
    )
