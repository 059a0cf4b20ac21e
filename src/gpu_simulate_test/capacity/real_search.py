"""``capacity.verify=search``: the capacity measured on the real engine, so that the predicted one
can be set beside it.

One served engine for the whole search. It starts at a **seed**: the simulated answer when there
is one (``phase=all`` simulates first), else the throughput a burst probe measures
(:func:`gpu_simulate_test.orchestrate.probe.measure_capacity`, the fidelity campaign's probe);
then :func:`.bracket.bracket_search` steps by ``capacity.verify_step`` (a step under 2 widening
to 2 while none brackets) until a pass and a miss bracket the knee and bisects until
high / low ≤ 1 + ``capacity.verify_bracket``. Each rate is **sized by time**: the workload's
first ⌈rate × ``verify_seconds``⌉ requests (within
``verify_min_requests`` .. ``verify_requests``; the same seed, arrivals scaled to the rate, as the
simulated search scales them), replayed by the real bench, re-run while the real bench marks it
disturbed (up to :data:`RERUNS` times, the truth's rule), and judged by the same goals on the
same (client) clock. ``verify_budget_s`` bounds the whole search: a rate expected not to fit in
what is left is not run, and the record and the console say so.

A multi-turn workload's rate is sessions/s, and every count is of sessions; only a backend that
runs sessions' closed loop can replay it (:func:`check_real_sessions`, before anything starts).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_simulate_test.capacity.bracket import WIDEN_TO, BracketRule, bracket_search
from gpu_simulate_test.capacity.search import Answer, Point, binding, judged_point
from gpu_simulate_test.capacity.search import latency_agreement as agreement
from gpu_simulate_test.capacity.sessions import rate_unit
from gpu_simulate_test.config.capacity import CapacityOptions, CapacityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.io.runs import Run
from gpu_simulate_test.orchestrate.configs import with_workload
from gpu_simulate_test.orchestrate.probe import measure_capacity, probe_size
from gpu_simulate_test.orchestrate.serving import (
    EarlyServer,
    check_sessions_served,
    served,
    starts_server,
)
from gpu_simulate_test.orchestrate.steps import make_workload
from gpu_simulate_test.orchestrate.truth import trusted_truth

RERUNS = 2
"""Re-runs of a rate the real bench marked disturbed."""


@dataclass(frozen=True)
class RealSearch:
    """The real search's answer and how it got there (``capacity.json`` ``verify``)."""

    measured: Answer
    runs: list[dict[str, Any]]
    """Per rate, in the order run: its rate, phase, requests, seconds of arrivals, wall, run."""
    wall_s: float
    seed: dict[str, Any] = field(default_factory=dict)
    """``from`` (simulated, probe), ``qps``, and the probe's record with its wall time."""
    plan: dict[str, Any] = field(default_factory=dict)
    """The knobs the search ran with (``capacity.verify_*``)."""
    stopped: dict[str, Any] | None = None
    """The rate the budget left out, what it was expected to take, what was left."""

    def record(self) -> dict[str, Any]:
        """How the search ran, beside its answer and runs (the split's manifest ``search``)."""
        return {"seed": self.seed, "plan": self.plan, "stopped": self.stopped}


def check_real_sessions(cfg: CapacityStageConfig) -> None:
    """``capacity.verify`` replays the workload on the real engine: a multi-turn one needs a
    backend that runs its sessions' closed loop; ConfigError, one line naming the workload and
    ``capacity.verify``, before anything runs (a single-turn workload passes)."""
    inner = cfg.pipeline()
    try:
        check_sessions_served(inner)
    except (ArtifactError, ConfigError):  # a trace that cannot be read says so itself
        raise
    except ValueError as exc:  # the backend runs no sessions
        workload = inner.workload
        named = (
            f"workload.trace_file={workload.trace_file}"
            if workload.source == "trace"
            else "workload.session.enabled=true"
        )
        raise ConfigError(
            f"capacity.verify={cfg.capacity.verify} replays the multi-turn workload ({named}) on "
            f"the real engine, but {exc}; capacity.verify=false searches it by simulation alone"
        ) from exc


def plan_record(opts: CapacityOptions) -> dict[str, Any]:
    """The knobs of the real search, as recorded."""
    return {
        "seconds": opts.verify_seconds,
        "min_requests": opts.verify_min_requests,
        "max_requests": opts.verify_requests,
        "seed": opts.verify_seed,
        "step": opts.verify_step,
        "bracket": opts.verify_bracket,
        "budget_s": opts.verify_budget_s,
    }


def search_rule(opts: CapacityOptions) -> BracketRule:
    """The real search's rule: ``capacity.verify_step``, widening to :data:`~.bracket.WIDEN_TO`
    while no step brackets, ``verify_bracket`` and ``verify_budget_s``."""
    return BracketRule(
        opts.verify_step, opts.verify_bracket, opts.verify_budget_s, widen_to=WIDEN_TO
    )


def search_base(
    cfg: CapacityStageConfig, inner: PipelineStageConfig
) -> tuple[PipelineStageConfig, Path]:
    """The configuration a real search serves (``search-base``) and its workload's folder."""
    base = with_workload(inner, "search-base", num_requests=cfg.capacity.verify_min_requests)
    return base, make_workload(base)


def early_server(
    cfg: CapacityStageConfig, inner: PipelineStageConfig, log_dir: Path
) -> EarlyServer | None:
    """The server of a real search to come, started now in a thread of its own
    (:class:`~..orchestrate.serving.EarlyServer`; pass it to :func:`real_search` as ``early``);
    None where the search would start none."""
    base, base_dir = search_base(cfg, inner)
    return EarlyServer(base, log_dir, base_dir) if starts_server(base) else None


def real_search(
    cfg: CapacityStageConfig,
    inner: PipelineStageConfig,
    r: Run,
    simulated_qps: float | None = None,
    log_dir: Path | None = None,
    early: EarlyServer | None = None,
) -> RealSearch:
    """The real search (module docstring), seeded at ``simulated_qps`` when given and
    ``capacity.verify_seed=auto``, else at a probe's capacity. The server logs into ``log_dir``
    (default: the run's directory, which then records it); ``early``: one :func:`early_server`
    started for this search, adopted instead of a new one."""
    from gpu_simulate_test.core.run_inputs import load_run
    from gpu_simulate_test.core.traffic.workloads import load_workload

    opts = cfg.capacity
    started = time.perf_counter()

    def elapsed() -> float:
        return time.perf_counter() - started

    rule = search_rule(opts)
    runs: list[dict[str, Any]] = []
    if cfg.progress:
        console.rule(f"[bold]the capacity on the real engine ({inner.backend.name})")
    base, base_dir = search_base(cfg, inner) if early is None else (early.cfg, early.workload_dir)
    unit = rate_unit(load_workload(base_dir).sessions)
    logs, record_in = (r.path, r) if log_dir is None else (log_dir, None)
    with served(base, logs, record_in, base_dir, "the real search", early) as at_server:
        seed = seed_of(opts, at_server, simulated_qps)
        # one line per step of the search, with or without progress: a log cut off by a
        # device call's limit still says how far it got
        console.print(f"real search: from {seed['qps']:g} {unit} ({seed['from']})")

        def expected_s(qps: float) -> float:
            """A rate's arrivals, plus the most any run so far took beyond its own (the engine's
            start, its drain); the probe's whole wall before any rate has run."""
            overheads = [run["wall_s"] - run["arrivals_s"] for run in runs]
            if not overheads and seed.get("probe"):
                overheads = [seed["probe"]["wall_s"]]
            return opts.requests_at(qps) / qps + max(overheads, default=0.0)

        def evaluate(qps: float, phase: str) -> Point:
            t0 = time.perf_counter()
            count = opts.requests_at(qps)
            run_id = f"search-{qps:g}"
            at = with_workload(at_server, run_id, qps=qps, num_requests=count)
            truth = trusted_truth(at, make_workload(at), run_id=run_id, reruns=RERUNS)
            requests = load_run(truth.real_dir, "real_bench").requests
            wall = time.perf_counter() - t0
            point = judged_point(qps, phase, requests, opts.slo, wall)
            runs.append(
                {
                    "qps": qps,
                    "phase": phase,
                    "requests": count,
                    "arrivals_s": round(count / qps, 3),
                    "wall_s": round(wall, 1),
                    "real_run": str(truth.real_dir),
                    "meets_slo": point.meets,
                    "truth": truth.describe(),
                    "disturbed": truth.disturbed,
                }
            )
            verdict = "meets" if point.meets else "misses"
            console.print(
                f"real search, {phase} {qps:g} {unit}: {count} requests over {count / qps:.1f} s, "
                f"{verdict} the goals ({wall:.0f} s; {elapsed():.0f} s so far)"
            )
            return point

        measured, stopped = bracket_search(
            evaluate, float(seed["qps"]), rule, expected_s, elapsed, unit
        )
    if stopped is not None:
        console.print(f"[yellow]the real search {stopped.sentence(rule.budget_s, unit)}")
    return RealSearch(
        measured,
        runs,
        elapsed(),
        seed,
        plan_record(opts),
        None if stopped is None else stopped.to_dict(),
    )


def seed_of(
    opts: CapacityOptions, at_server: PipelineStageConfig, simulated_qps: float | None
) -> dict[str, Any]:
    """Where the search starts: the simulated answer (``verify_seed=auto`` and one is given), else
    the capacity a burst probe measures on the served engine (its record and wall time)."""
    if opts.verify_seed == "auto" and simulated_qps is not None:
        return {"from": "simulated", "qps": simulated_qps, "probe": None}
    t0 = time.perf_counter()
    size = probe_size(at_server, opts.verify_probe_requests)
    probe = measure_capacity(at_server, "search-probe", size)
    truth = probe.pop("truth", None) or {}  # its paths stay out of the record: only the verdict
    probe["disturbed"] = bool(truth.get("disturbed"))
    probe["wall_s"] = round(time.perf_counter() - t0, 1)
    return {"from": "probe", "qps": float(probe["capacity_qps"]), "probe": probe}


def search_record(
    predicted: Answer,
    found: RealSearch,
    keys: tuple[str, ...] = (),
    at_real_rates: tuple[Point, ...] = (),
) -> dict[str, Any]:
    """``capacity.json`` ``verify`` of a real search: the measured capacity beside the answer,
    how the search was seeded and stopped, each rate's requests, seconds and wall time.
    ``at_real_rates``: simulations at the real rates the simulated search did not run, which
    the latency agreement reads beside its own."""
    measured = found.measured
    beside = dataclasses.replace(predicted, points=predicted.points + at_real_rates)
    ratio = (
        predicted.qps / measured.qps
        if predicted.qps is not None and measured.qps is not None
        else None
    )
    return {
        "mode": "search",
        "answer_qps": predicted.qps,
        "measured_capacity_qps": measured.qps,
        "ratio": ratio,
        "measured_bracket_qps": list(measured.bracket),
        "bracket_narrow": narrowed(found),
        "binding": {"simulated": binding(predicted), "real": binding(measured)},
        "note": measured.note,
        "latency_agreement": agreement(beside, measured, keys),
        **found.record(),
        "disturbed_rates": [run["qps"] for run in found.runs if run["disturbed"]],
        "wall_time_s": round(found.wall_s, 1),
        "runs": found.runs,
    }


def narrowed(found: RealSearch) -> bool:
    """Whether the search narrowed its bracket as asked (``capacity.verify_bracket``): a rate
    that met the goals and one that missed them, that close. A search its budget or its steps
    stopped first knows only that the capacity lies in its bracket: its low end is no measured
    capacity to set a ratio or a band against (a budget that stopped one step above the seed read
    "1.00x" and "inside the band" of a bracket 21..42 req/s, 2026-12-07)."""
    low, high = found.measured.bracket
    if found.stopped is not None or found.measured.qps is None or high is None:
        return False
    return BracketRule(bracket=float(found.plan.get("bracket", 0.1))).narrow(low, high)


def rates_to_simulate(simulated: Answer, found: RealSearch) -> list[float]:
    """The real search's rates the simulated search did not run: simulated too, so that the two
    curves' latencies meet at every real rate (``latency_agreement``)."""
    done = {p.qps for p in simulated.points}
    return sorted({p.qps for p in found.measured.points} - done)
