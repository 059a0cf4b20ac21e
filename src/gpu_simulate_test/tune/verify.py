"""``tune.verify``: the simulated capacities checked on the real engine, each configuration on a
vLLM server of its own (restarted per configuration, as vLLM's ``auto_tune`` does).

``top_k``: the best ``tune.top_k`` configurations by simulation, the answer to
``tune.target_qps`` and the configured backend; each
real search starts at its simulated capacity and steps by ``1 + tune.verify_margin``, then
bisects to that width: a right prediction costs two rates (one meets the goals just below the
capacity, one misses just above). ``grid``: every valid configuration, by the capacity stage's
own real search (``capacity.verify_*``: steps of 2, a 10% bracket), for the side-by-side."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gpu_simulate_test.calibration.frontend_scale import follows_steps
from gpu_simulate_test.calibration.level import Predict, level_of, run_sums
from gpu_simulate_test.capacity.real_search import (
    RealSearch,
    early_server,
    rates_to_simulate,
    real_search,
    search_record,
)
from gpu_simulate_test.capacity.search import Point
from gpu_simulate_test.config.capacity import CapacityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import nested_output
from gpu_simulate_test.config.tune import TuneStageConfig
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.runs import Run
from gpu_simulate_test.orchestrate.serving import EarlyServer
from gpu_simulate_test.orchestrate.step_level import run_schedule
from gpu_simulate_test.tune.fleet import fewest_meeting
from gpu_simulate_test.tune.simulate import Simulated
from gpu_simulate_test.tune.space import Candidate
from gpu_simulate_test.tune.verdict import judged

RUNS_DIR = layout.RUNS_DIR
"""Each checked configuration's real runs: ``runs/<config_id>/``, its server's logs in
``runs/<config_id>/server``."""


def chosen(ranked: list[Simulated], cfg: TuneStageConfig) -> list[Simulated]:
    """The configurations ``tune.verify`` runs: the best ``top_k``, the configured one and,
    with ``tune.target_qps``, the answer to it (the fewest GPUs meeting it, the
    recommendation: not among the top by capacity, which are the largest fleets) (``top_k``),
    or every one that was simulated (``grid``); of those the real bench can serve
    (``Candidate.checkable``)."""
    valid = [s for s in ranked if s.capacity is not None and s.candidate.checkable]
    if cfg.tune.verify == "grid":
        return valid
    picked = valid[: cfg.tune.top_k]
    target = fewest_meeting(ranked, cfg.tune.target_qps) if cfg.tune.target_qps else None
    configured = next((s for s in valid if s.candidate.configured), None)
    for also in (target, configured):
        if also is not None and also in valid and also not in picked:
            picked.append(also)
    return picked


def search_options(cfg: TuneStageConfig) -> CapacityStageConfig:
    """The capacity stage's config each configuration's real search runs with (its options:
    the tune's ``capacity.*``; ``top_k``'s steps and bracket from ``tune.verify_margin``)."""
    opts = cfg.tune
    budget = opts.verify_budget_s or cfg.capacity.verify_budget_s
    if opts.verify == "top_k":
        return cfg.as_capacity(
            verify_seed="auto",
            verify_step=1.0 + opts.verify_margin,
            verify_bracket=opts.verify_margin,
            verify_budget_s=budget,
        )
    return cfg.as_capacity(verify_budget_s=budget)


def checked_at(
    inner: PipelineStageConfig, candidate: Candidate, r: Run
) -> tuple[PipelineStageConfig, Path]:
    """Where ``candidate``'s real search runs: ``inner`` with its backend, its runs and its
    server's logs under ``runs/<config_id>/``."""
    root = r.file(RUNS_DIR) / candidate.config_id
    (root / "server").mkdir(parents=True, exist_ok=True)
    at = dataclasses.replace(
        inner,
        backend=candidate.backend,
        output=nested_output(inner.output, root),
        progress=False,
    )
    return at, root / "server"


def start_configured(
    cfg: TuneStageConfig, inner: PipelineStageConfig, found: list[Candidate], r: Run
) -> EarlyServer | None:
    """``tune.verify=top_k`` always checks the configured backend: its server, started now so
    that its start overlaps the simulation of the space (no measurement runs then), and
    adopted by :func:`confirm`; None for the other modes or objectives, or a configured
    backend vLLM would refuse."""
    if cfg.tune.verify != "top_k" or cfg.tune.objective != "capacity":
        return None
    configured = next((c for c in found if c.configured and not c.invalid), None)
    if configured is None:
        return None
    at, logs = checked_at(inner, configured, r)
    return early_server(search_options(cfg), at, logs)


def confirm(
    cfg: TuneStageConfig,
    inner: PipelineStageConfig,
    picked: list[Simulated],
    r: Run,
    simulate_at: Callable[[Simulated, list[float]], tuple[Point, ...]],
    step_model: Callable[[Simulated], tuple[Predict, Any] | None] | None = None,
    at_level: Callable[[Simulated, float], Simulated] | None = None,
    searches: dict[str, RealSearch] | None = None,
    early: EarlyServer | None = None,
) -> dict[str, Any]:
    """Each picked configuration's real search; ``tune.json`` ``verify``: per configuration the
    simulated and the measured capacity, and whether the measured best is in the simulated
    top 2. ``simulate_at`` simulates a configuration at the real rates its search did not
    reach, so that each row also sets the goal percentiles side by side where both ran
    (``latency_agreement``, as the capacity stage's). With ``step_model`` (a configuration's
    step model, as its simulation times steps), each row says how fast its server's steps ran
    against it (``server_step_level``, :func:`server_level`) and, with ``at_level``, the
    capacity simulated again at that level (``simulated_at_server_level_qps``): what the
    simulation says for a server as fast as this one, so that what the server's speed explains
    is told apart from what the model misses. ``searches`` (when given) keeps each
    configuration's real search, for a second calibration to read again. ``early``: the
    configured backend's server, started ahead (:func:`start_configured`): that configuration
    is checked first, on it. With ``tune.servers_at_once`` above 1 (``top_k``), the next
    configurations' servers start together before the first of them is checked
    (:func:`start_together`); ``server_starts`` records how, and each server's seconds to
    ``/health``. The rows keep the simulated order."""
    searched = search_options(cfg)
    started = time.perf_counter()
    rows: dict[str, dict[str, Any]] = {}
    ahead = [s for s in picked if early is not None and s.candidate.configured]
    order = ahead + [s for s in picked if s not in ahead]
    servers = {ahead[0].candidate.config_id: early} if ahead and early is not None else {}
    at_once = cfg.tune.servers_at_once if cfg.tune.verify == "top_k" else 1
    ready: dict[str, float | None] = {}
    try:
        for k, sim in enumerate(order, 1):
            c = sim.candidate
            if at_once > 1 and (k - 1) % at_once == 0:  # the first of a batch of servers
                batch = order[k - 1 : k - 1 + at_once]
                start_together(inner, batch, r, searched, servers, cfg.tune.server_stagger_s)
            if cfg.progress:
                console.rule(f"[bold]{k}/{len(picked)}: {c.config_id} on the real engine")
            at, logs = checked_at(inner, c, r)
            adopted = servers.pop(c.config_id, None)
            found = real_search(searched, at, r, sim.capacity, log_dir=logs, early=adopted)
            if adopted is not None:
                ready[c.config_id] = adopted.ready_s
            if searches is not None:
                searches[c.config_id] = found
            rows[c.config_id] = checked_row(cfg, sim, found, simulate_at, step_model, at_level)
    finally:
        for left in servers.values():  # started, never checked (an earlier check failed)
            left.stop()
    ordered = [rows[s.candidate.config_id] for s in picked]
    record = summary(ordered, cfg, time.perf_counter() - started)
    record["server_starts"] = {
        "servers_at_once": at_once,
        "stagger_s": cfg.tune.server_stagger_s if at_once > 1 else None,
        "during_simulation": ahead[0].candidate.config_id if ahead else None,
        "ready_s": ready,
    }
    return record


def start_together(
    inner: PipelineStageConfig,
    batch: list[Simulated],
    r: Run,
    searched: CapacityStageConfig,
    servers: dict[str, EarlyServer],
    stagger_s: float = 0.0,
) -> None:
    """Start the servers of ``batch`` that are not up yet, together, each ``stagger_s`` after the
    launch before it while that one still starts (:func:`launch_delay`), and wait until every
    one answers (or failed: its check raises it): no measurement runs while a server starts.
    Then pause all but the first (SIGSTOP; :meth:`~..orchestrate.serving.EarlyServer.join`
    thaws each at its turn): an idle vLLM server still takes about 1.6% of a core."""
    fresh = [sim.candidate for sim in batch if sim.candidate.config_id not in servers]
    t0 = time.perf_counter()
    for candidate in fresh:
        starting = [s.started for s in servers.values() if s.ready_s is None and s.error is None]
        time.sleep(launch_delay(starting, time.perf_counter(), stagger_s))
        at, logs = checked_at(inner, candidate, r)
        started = early_server(searched, at, logs)
        if started is not None:
            servers[candidate.config_id] = started
    for server in servers.values():
        server.wait()
    for sim in batch[1:]:  # frozen until their turn: an idle server still wakes up now and then
        if sim.candidate.config_id in servers:
            servers[sim.candidate.config_id].pause()
    apart = f", launched {stagger_s:g} s apart" if stagger_s and len(fresh) > 1 else ""
    console.print(
        f"servers of {', '.join(s.candidate.config_id for s in batch)} up together "
        f"({len(fresh)} started{apart}, {time.perf_counter() - t0:.0f} s): each measured alone, "
        "the others paused"
    )


def launch_delay(starting: list[float], now: float, stagger_s: float) -> float:
    """Seconds to wait before launching the next server: until ``stagger_s`` after the latest
    launch (``perf_counter`` times) of the servers still starting (``starting``); none when no
    server is starting or that moment has passed. vLLM on CPU pins a server's worker to the
    engine's core while it imports, so workers launched together import one after another on
    that core, the other idle: 4 servers launched at once were up in 115 s, launched 6-12 s
    apart in 98.6-98.8 s (2026-11-28, 2 cores); in the tune benchmark, 3 launched 10 s apart
    were up 76 s after the first launch, 97 s launched at once the day before."""
    if not starting or stagger_s <= 0:
        return 0.0
    return max(0.0, max(starting) + stagger_s - now)


def checked_row(
    cfg: TuneStageConfig,
    sim: Simulated,
    found: RealSearch,
    simulate_at: Callable[[Simulated, list[float]], tuple[Point, ...]],
    step_model: Callable[[Simulated], tuple[Predict, Any] | None] | None = None,
    at_level: Callable[[Simulated, float], Simulated] | None = None,
) -> dict[str, Any]:
    """One checked configuration's row: its simulated search (``sim``) beside its real one
    (``found``), the simulation at the real rates it did not run, the server's step level and
    the capacity simulated at it (see :func:`confirm`)."""
    pct = cfg.capacity.slo.percentile
    keys = tuple(f"{metric}_p{pct}" for metric in cfg.capacity.slo.goals())
    assert sim.answer is not None  # chosen() picks configurations with a capacity
    extra = simulate_at(sim, rates_to_simulate(sim.answer, found))
    model = step_model(sim) if step_model is not None else None
    level = server_level(model, found)
    entry = row(sim, search_record(sim.answer, found, keys, extra), found, level)
    if level is not None and at_level is not None:
        entry["simulated_at_server_level_qps"] = at_level(sim, judged_level(level)).capacity
        entry["server_step_level"]["front_end"] = follows_steps(cfg.hardware.device)
    return entry


def server_level(model: tuple[Predict, Any] | None, found: RealSearch) -> dict[str, Any] | None:
    """The configuration's server's steps against its step model, over every rate its real
    search ran (:func:`~..calibration.level.step_level`), and ``judged``: the same over the
    runs at the rates that decided the measured capacity (the bracket's: the highest rate that
    met the goals and the lowest that missed them), with those ``rates``; None without a model
    or the engine's step record. A server's speed moves within its search (one ran 1.06-1.11x
    the model at its low rates and 1.23-1.28x at its bracket's, 2026-11-29): the capacity is
    decided where it was judged."""
    if model is None:
        return None
    sums: list[tuple[float, tuple[float, float, int]]] = []  # per run: its rate, its sums
    for run in found.runs:
        real = Path(str(run.get("real_run", "")))
        if (real / layout.ENGINE_SCHEDULE).is_file():
            sums.append((float(run["qps"]), run_sums(run_schedule(real), *model)))
    level = level_of([s for _, s in sums])
    if level is None:
        return None
    rates = {q for q in found.measured.bracket if q is not None}
    judged = level_of([s for q, s in sums if q in rates])
    level["judged"] = None if judged is None else {
        "ratio": judged["ratio"],
        "steps": judged["steps"],
        "rates": sorted(rates),
    }  # fmt: skip
    return level


def judged_level(level: Mapping[str, Any]) -> float:
    """The level the capacity is simulated again at: the judged rates' (``judged``), else the
    whole search's."""
    judged = level.get("judged")
    return float(judged["ratio"] if judged else level["ratio"])


def row(
    sim: Simulated,
    record: Mapping[str, Any],
    found: RealSearch,
    level: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """One checked configuration, from the capacity stage's record of its real search beside
    the simulated one (:func:`~..capacity.real_search.search_record`), and its server's step
    level (:func:`server_level`)."""
    predicted, ratio = record["answer_qps"], record["ratio"]
    low, high = record["measured_bracket_qps"]
    return {
        "config_id": sim.candidate.config_id,
        "configured": sim.candidate.configured,
        "simulated_qps": predicted,
        "measured_qps": record["measured_capacity_qps"],
        "measured_bracket_qps": [low, high],
        "ratio": None if ratio is None else round(ratio, 4),
        "simulated_in_bracket": (
            predicted is not None and low <= predicted and (high is None or predicted < high)
        ),
        "binding": record["binding"],
        "note": record["note"],
        "rates": [
            {"qps": p.qps, "meets_slo": p.meets, "violated": list(p.violated)}
            for p in found.measured.points
        ],
        "disturbed_rates": record["disturbed_rates"],
        "stopped": record["stopped"],
        "wall_time_s": record["wall_time_s"],
        "latency_agreement": record["latency_agreement"],
        "server_step_level": None if level is None else dict(level),
        "simulated_at_server_level_qps": None,
    }


SPEED_OFF = 0.08
"""A pooled step level this far from 1, with every checked server on the same side of 1, says
the calibration ran at another speed of the host than the servers checked after it. Fresh servers
differ by about 15% (CV) on the project's CPU host, two-signed; all of them one-signed is the
calibration's moment (2026-11-28: 22 servers at 0.80–0.95, a fresh calibration ten minutes
later timed the same 1-decode steps 20% faster than that one had)."""


def calibration_speed(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The checked servers' step levels together: ``pooled_level`` (mean of the levels, each
    weighted by its busy steps), ``servers``, ``range``, ``one_sided`` (every level on the same
    side of 1) and ``note``: what to do when the calibration looks off (:data:`SPEED_OFF`), else
    empty; None without a level."""
    levels = [
        (float(r["server_step_level"]["ratio"]), int(r["server_step_level"]["steps"]))
        for r in rows
        if r.get("server_step_level")
    ]
    if not levels:
        return None
    pooled = sum(x * n for x, n in levels) / sum(n for _, n in levels)
    low, high = min(x for x, _ in levels), max(x for x, _ in levels)
    one_sided = high < 1.0 or low > 1.0
    note = ""
    if len(levels) >= 2 and one_sided and abs(pooled - 1.0) > SPEED_OFF:
        ran, capacities = ("faster", "low") if pooled < 1.0 else ("slower", "high")
        note = (
            f"every server checked ({len(levels)}) ran {ran} than the calibration's step model "
            f"(levels {low:.2f}-{high:.2f}, pooled {pooled:.3f}): the calibration sampled "
            f"another speed of the host, and the simulated capacities are likely {capacities}; "
            "re-calibrate (vidur_profile ... output.overwrite=true) and tune again, or read "
            "each checked configuration's capacity at its server's level"
        )
    return {
        "pooled_level": round(pooled, 4),
        "servers": len(levels),
        "range": [low, high],
        "one_sided": one_sided,
        "note": note,
    }


def summary(rows: list[dict[str, Any]], cfg: TuneStageConfig, wall_s: float) -> dict[str, Any]:
    """The verify record: rows in the simulated order, the measured best and whether it is among
    the simulated top 2 (of the rows checked), the measured ranking, and the judgement that
    names no winner inside the spread between servers (:func:`.verdict.judged`)."""
    measured = [r for r in rows if r["measured_qps"] is not None]
    best = max(measured, key=lambda r: r["measured_qps"], default=None)
    top2 = [r["config_id"] for r in rows[:2]]
    return {
        "mode": cfg.tune.verify,
        "margin": cfg.tune.verify_margin if cfg.tune.verify == "top_k" else None,
        "configs": rows,
        "simulated_best": rows[0]["config_id"] if rows else None,
        "measured_best": None if best is None else best["config_id"],
        "measured_best_in_sim_top2": None if best is None else best["config_id"] in top2,
        "measured_order": [
            r["config_id"] for r in sorted(measured, key=lambda r: -float(r["measured_qps"]))
        ],
        "calibration_speed": calibration_speed(rows),
        "wall_time_s": round(wall_s, 1),
        **judged(rows, cfg.tune.server_spread),
    }
