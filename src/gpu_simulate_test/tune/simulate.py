"""Every configuration of the space by simulation, from one workload, one profile and one
calibration: the configured backend's capacity by the capacity stage's grid search, then each
other configuration's by a bracket search from there (a configuration near the configured one
needs few rates: its seed, a step, a few bisections)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpu_simulate_test.calibration.frontend_scale import at_level
from gpu_simulate_test.calibration.level import Predict
from gpu_simulate_test.capacity.bracket import BracketRule, bracket_search
from gpu_simulate_test.capacity.search import Answer, Point, binding, rounded, search
from gpu_simulate_test.capacity.seeds import median_position
from gpu_simulate_test.capacity.stage import simulated_rate
from gpu_simulate_test.config.fleet import FleetConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.tune import TuneStageConfig
from gpu_simulate_test.config.vidur import derived_seed
from gpu_simulate_test.core.engines.knobs import derive_scheduler
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.orchestrate.configs import simulate_config
from gpu_simulate_test.tune.pool import run_tasks, workers_for
from gpu_simulate_test.tune.space import Candidate

if TYPE_CHECKING:
    from gpu_simulate_test.simulator.step_model import StepModel

AT_LEVEL = "at-level"
"""Under the points: each verified configuration simulated again at its server's step level."""
GROUP_ENGINES = 4
"""Engine configurations per task of the space, each with all its fleets: a task builds each
engine's step model once, and learns the fleets' gain over one engine as it goes (a larger task
seeds better, a smaller one spreads over more workers); fixed, so that the answer does not
depend on how many workers there are."""
SIM_MAX_STEPS = 12
"""Steps of ``tune.sim_step`` from the seed before a configuration's search gives up on a
bracket (1.5¹² ≈ 130×)."""


@dataclass(frozen=True)
class Simulated:
    """One configuration's simulated result."""

    candidate: Candidate
    answer: Answer | None = None
    """The capacity search's answer (``objective=capacity``)."""
    at_rate: Point | None = None
    """Its latency at the shared rate: the reference rate (the configured backend's capacity)
    for ``capacity``, ``tune.qps`` for ``goodput``."""
    error: str = ""
    """Why it was not simulated (vLLM refuses it, or the bundle cannot simulate it)."""
    simulations: int = 0
    seed_scores: tuple[float, ...] = ()
    """``tune.sim_seeds`` > 1: the capacity (or goodput) under each noise seed, ``vidur.seed``
    first (-1: no rate met the goals); this result is the median one's. Empty: one seed."""

    @property
    def capacity(self) -> float | None:
        return None if self.answer is None else self.answer.qps

    @property
    def goodput(self) -> float | None:
        return None if self.at_rate is None else self.at_rate.goodput_qps

    def binding(self) -> list[str]:
        return [] if self.answer is None else binding(self.answer)


@dataclass(frozen=True)
class TuneInputs:
    """What every configuration's simulation shares: the stage's config, the pipeline config of
    its runs, the one workload (and its longest prompt), where a configuration's step model is
    built, and the step models built so far (one per configuration and calibration: each rate of
    a configuration simulates in memory with its model)."""

    cfg: TuneStageConfig
    inner: PipelineStageConfig
    workload_dir: Path
    longest_prompt: int
    points_dir: Path
    models: dict[str, StepModel | None] = field(default_factory=dict, compare=False)
    per_engine: int = 0
    """A space with fleets: each configuration simulates at most this many requests per engine
    (the workload holds them for the largest fleet), so that every fleet is judged on as many
    requests per engine as one engine is; 0: the whole workload."""


def model_for(
    tuned: TuneInputs, candidate: Candidate, sim_cfg: Any, inputs: Any
) -> StepModel | None:
    """The configuration's step model, built the first time it is asked for (its key: the
    simulation config at level 1, which names the bundle, the calibration and the knobs)."""
    from gpu_simulate_test.vidur_simulate.stage import step_model_of

    # the seed is drawn when a simulation runs, not when its step model is built; the front
    # end's scale is read by the inputs, not the step model
    level_one = dataclasses.replace(
        sim_cfg.vidur, step_time_scale=1.0, frontend_time_scale=1.0, seed=0
    )
    # one engine's model: a fleet's engines are its copies (the fleet is the simulation's)
    key = repr(dataclasses.replace(sim_cfg, vidur=level_one, fleet=FleetConfig()))
    if key not in tuned.models:
        where = tuned.points_dir / candidate.config_id
        tuned.models[key] = step_model_of(sim_cfg, inputs, where)
    return tuned.models[key]


def scheduler_inputs(
    tuned: TuneInputs, candidate: Candidate, seed_offset: int = 0
) -> tuple[Any, Any]:
    """The simulation config and checked inputs of one configuration (its Vidur scheduler
    derived from its knobs, its fleet from its replicas and router; its noise seed
    ``vidur.seed + seed_offset``); ConfigError or ArtifactError when it cannot be simulated."""
    from gpu_simulate_test.vidur_simulate.inputs import first_requests
    from gpu_simulate_test.vidur_simulate.stage import prepare

    inner, workload_dir = tuned.inner, tuned.workload_dir
    scheduler, _ = derive_scheduler(candidate.backend, inner.vidur.scheduler, tuned.longest_prompt)
    at = dataclasses.replace(inner, backend=candidate.backend)
    sim_cfg = simulate_config(at, scheduler, workload_dir)
    seed = derived_seed(sim_cfg.vidur.seed, seed_offset)
    vidur = dataclasses.replace(sim_cfg.vidur, step_log=False, seed=seed)
    sim_cfg = dataclasses.replace(sim_cfg, vidur=vidur, fleet=candidate.fleet)
    inputs = prepare(sim_cfg)
    if tuned.per_engine:
        inputs = first_requests(inputs, tuned.per_engine * candidate.replicas)
    return sim_cfg, inputs


def simulate_space(
    tuned: TuneInputs, found: list[Candidate], advance: Callable[[int], None] = lambda n: None
) -> tuple[list[Simulated], float | None]:
    """Every configuration simulated (:class:`Simulated`, the order of ``found``), and the
    shared rate their latencies are read at. The first (the configured backend) by the grid
    search; each next one is the configuration nearest to those already done (fewest knobs
    apart), seeded at that neighbour's answer. With fleets in the space, one fleet of each size
    and router follows, one after another (they teach each fleet's gain over one engine); then
    the rest are tasks, each a few engine configurations with their fleets
    (:func:`fleet_groups`, :func:`simulate_group`), run side by side (``tune.workers``,
    ``tune.executor``: :mod:`~.pool`); each task is seeded only by what went before the tasks
    and by its own, so the answer is the same wherever they ran."""
    cfg, opts = tuned.cfg, tuned.cfg.tune
    first = next((c for c in found if c.configured and not c.invalid), None)
    first = first or next(c for c in found if not c.invalid)
    results: dict[str, Simulated] = {}
    shared: float | None = opts.qps if opts.objective == "goodput" else None
    results[first.config_id] = one_configuration(tuned, first, shared, None, True)
    advance(1)
    if shared is None:  # the reference: the latencies are read there
        answer = results[first.config_id].answer
        shared = rounded(answer.qps if answer and answer.qps else cfg.capacity.qps_min)
    leading, groups = fleet_groups(found, first)
    chain(tuned, leading, results, shared, advance)
    answered = tuple(s for s in results.values() if s.capacity)
    local = opts.executor == "local" and workers_for(opts.workers, len(groups)) == 1
    # a task for another process carries no step models (each builds its engine's once)
    carried = tuned if local else dataclasses.replace(tuned, models={})
    tasks = [Group(carried, tuple(group), shared, answered) for group in groups]

    def finished(_: int, out: list[Simulated]) -> None:
        results.update((s.candidate.config_id, s) for s in out)
        advance(len(out))

    run_tasks(
        simulate_group, tasks, workers=opts.workers, executor=opts.executor,
        address=opts.ray_address, done=finished,
    )  # fmt: skip
    return [results[c.config_id] for c in found], shared


def chain(
    tuned: TuneInputs,
    todo: list[Candidate],
    done: dict[str, Simulated],
    shared: float | None,
    advance: Callable[[int], None] = lambda n: None,
) -> list[Simulated]:
    """``todo`` simulated one after another, each the one nearest to those in ``done`` (where
    each is added), seeded at that neighbour's answer; their results in the order run."""
    todo, out = list(todo), []
    while todo:
        candidate, seed = nearest(todo, done, shared)
        todo.remove(candidate)
        result = one_configuration(tuned, candidate, shared, seed, False)
        done[candidate.config_id] = result
        out.append(result)
        advance(1)
    return out


@dataclass(frozen=True)
class Group:
    """One task of the space: the fleets of a few engine configurations, seeded by the answers
    simulated before the tasks began and by each other's, in turn."""

    tuned: TuneInputs
    candidates: tuple[Candidate, ...]
    shared: float | None
    answered: tuple[Simulated, ...]


def simulate_group(group: Group) -> list[Simulated]:
    """One :class:`Group` simulated (in whichever process or Ray worker runs it)."""
    done = {s.candidate.config_id: s for s in group.answered}
    return chain(group.tuned, list(group.candidates), done, group.shared)


def fleet_groups(
    found: list[Candidate], first: Candidate
) -> tuple[list[Candidate], list[list[Candidate]]]:
    """The configurations simulated one after another, and the tasks. Without fleets in the
    space, every configuration but ``first`` one after another (each seeds the next). With
    fleets, one after another the refused ones and for each fleet size and router the one
    nearest ``first``'s engine (they teach each fleet's gain over one engine); then the tasks:
    every configuration of :data:`GROUP_ENGINES` engine configurations each, one engine and its
    fleets (the order of ``found``)."""
    rest = [c for c in found if c is not first]
    if all(c.replicas == 1 for c in found):
        return rest, []
    leading = [c for c in rest if c.invalid]
    kinds: dict[tuple[int, str], Candidate] = {}
    for c in rest:
        if c.replicas == 1 or c.invalid or (c.replicas, c.router) == (first.replicas, first.router):
            continue
        held = kinds.get((c.replicas, c.router))
        if held is None or engine_apart(c, first) < engine_apart(held, first):
            kinds[(c.replicas, c.router)] = c
    leading.extend(kinds.values())
    picked = {c.config_id for c in leading}
    by_engine: dict[str, list[Candidate]] = {}
    for c in rest:
        if c.config_id not in picked:
            by_engine.setdefault(engine_key(c), []).append(c)
    engines = list(by_engine.values())
    return leading, [
        [c for configs in engines[at : at + GROUP_ENGINES] for c in configs]
        for at in range(0, len(engines), GROUP_ENGINES)
    ]


def engine_key(candidate: Candidate) -> str:
    """The engine configuration a candidate's replicas run (its knobs, not its fleet)."""
    return repr(sorted(candidate.knobs.items()))


def engine_apart(a: Candidate, b: Candidate) -> int:
    """Engine knobs that differ between two configurations."""
    return sum(a.knobs[n] != b.knobs[n] for n in a.knobs)


def nearest(
    todo: list[Candidate], done: Mapping[str, Simulated], fallback: float | None
) -> tuple[Candidate, float | None]:
    """The next configuration to simulate, the one fewest knobs from one already simulated with
    an answer, and that answer (the seed of its search; a fleet's scaled by :func:`fleet_scale`;
    ``fallback`` when none has one)."""
    answered = [s for s in done.values() if s.capacity]
    best: tuple[int, int, Candidate, Simulated] | None = None
    for k, candidate in enumerate(todo):
        for sim in answered:
            apart = candidate.apart(sim.candidate)
            if best is None or (apart, k) < best[:2]:
                best = (apart, k, candidate, sim)
    if best is None:
        return todo[0], fallback
    _, _, candidate, sim = best
    assert sim.capacity is not None
    return candidate, sim.capacity * fleet_scale(candidate, sim.candidate, answered)


def fleet_scale(to: Candidate, of: Candidate, answered: list[Simulated]) -> float:
    """How much more ``to``'s fleet serves than ``of``'s: the median ratio of the configurations
    already simulated with both fleets and the same engine knobs (a fleet's queueing gain over
    its engines, learnt as the search goes), else the ratio of their replicas."""
    if (to.replicas, to.router) == (of.replicas, of.router):
        return 1.0
    by_fleet: dict[tuple[int, str], dict[str, float]] = {}
    for sim in answered:
        c = sim.candidate
        by_fleet.setdefault((c.replicas, c.router), {})[engine_key(c)] = float(sim.capacity or 0.0)
    ours = by_fleet.get((to.replicas, to.router), {})
    theirs = by_fleet.get((of.replicas, of.router), {})
    ratios = sorted(ours[k] / theirs[k] for k in ours.keys() & theirs.keys() if theirs[k] > 0)
    if not ratios:
        return to.replicas / of.replicas
    return ratios[len(ratios) // 2]


def one_configuration(
    tuned: TuneInputs,
    candidate: Candidate,
    shared: float | None,
    seed: float | None,
    grid: bool,
) -> Simulated:
    """One configuration (:func:`one_search`) under each of ``tune.sim_seeds`` noise seeds, the
    later ones seeded at the first's answer; the median one's result (the lower middle for an
    even count) with every seed's score. A configuration that no rate serves under the first
    seed is not searched again."""
    first = one_search(tuned, candidate, shared, seed, grid)
    count = tuned.cfg.tune.sim_seeds
    if count <= 1 or first.error or noise_score(first) <= 0:
        return first
    start = first.capacity if first.capacity is not None else seed
    runs = [first]
    runs += [one_search(tuned, candidate, shared, start, False, k) for k in range(1, count)]
    return median_seed(runs)


def noise_score(sim: Simulated) -> float:
    """A result's score for the median over seeds: its capacity, else its goodput; -1: none."""
    value = sim.capacity if sim.answer is not None else sim.goodput
    return -1.0 if value is None else float(value)


def median_seed(runs: list[Simulated]) -> Simulated:
    """The median of one configuration's results under several seeds (the lower middle one for
    an even count), carrying every seed's score and every seed's simulations."""
    scores = [noise_score(s) for s in runs]
    chosen = runs[median_position(scores)]
    return dataclasses.replace(
        chosen,
        seed_scores=tuple(scores),
        simulations=sum(s.simulations for s in runs),
    )


def one_search(
    tuned: TuneInputs,
    candidate: Candidate,
    shared: float | None,
    seed: float | None,
    grid: bool,
    seed_offset: int = 0,
) -> Simulated:
    """One configuration under the noise seed ``vidur.seed + seed_offset``: the goodput at
    ``tune.qps``, or its capacity (the grid search when ``grid`` or without a seed, else a
    bracket search from ``seed``) and its latency at the shared rate (simulated there when the
    search did not reach it)."""
    if candidate.invalid:
        return Simulated(candidate, error=candidate.invalid)
    try:
        sim_cfg, inputs = scheduler_inputs(tuned, candidate, seed_offset)
    except (ConfigError, ArtifactError) as exc:
        return Simulated(candidate, error=str(exc))
    opts, capacity = tuned.cfg.tune, tuned.cfg.capacity
    model = model_for(tuned, candidate, sim_cfg, inputs)
    where = None if model is not None else tuned.points_dir / candidate.config_id
    if where is not None and seed_offset:
        where = where / f"seed-{sim_cfg.vidur.seed}"
    count = 0

    def evaluate(qps: float, phase: str) -> Point:
        nonlocal count
        count += 1
        return simulated_rate(sim_cfg, inputs, qps, phase, where, capacity, model)[0]

    if opts.objective == "goodput":
        assert shared is not None
        point = evaluate(shared, "goodput")
        return Simulated(candidate, None, point, simulations=1)
    if grid or seed is None:
        answer = search(
            evaluate,
            capacity.qps_min,
            capacity.qps_max,
            capacity.points,
            capacity.refine,
            capacity.extend,
        )
    else:
        rule = BracketRule(
            opts.sim_step, opts.sim_bracket, max_steps=SIM_MAX_STEPS,
            first_step=1.0 + 0.98 * opts.sim_bracket,  # within the bracket once rounded
        )  # fmt: skip
        answer, _ = bracket_search(evaluate, seed, rule)
    at = None
    if shared is not None:
        at = next((p for p in answer.points if p.qps == rounded(shared)), None)
        at = at or evaluate(rounded(shared), "shared")
    elif answer.qps is not None:
        at = next((p for p in answer.points if p.qps == answer.qps), None)
    return Simulated(candidate, answer, at, simulations=count)


def simulator_at(tuned: TuneInputs) -> Callable[[Simulated, list[float]], tuple[Point, ...]]:
    """For ``tune.verify``: a configuration simulated at the given rates (the real search's that
    its simulated search did not run)."""

    def at(sim: Simulated, rates: list[float]) -> tuple[Point, ...]:
        if not rates:
            return ()
        candidate = sim.candidate
        sim_cfg, inputs = scheduler_inputs(tuned, candidate)
        model = model_for(tuned, candidate, sim_cfg, inputs)
        where = None if model is not None else tuned.points_dir / candidate.config_id
        return tuple(
            simulated_rate(sim_cfg, inputs, qps, "real-rate", where, tuned.cfg.capacity, model)[0]
            for qps in rates
        )

    return at


def step_model(tuned: TuneInputs) -> Callable[[Simulated], tuple[Predict, Any] | None]:
    """For ``tune.verify``: a configuration's step model as its simulation times steps (the
    predictor with the engine overhead, and the serving terms), for its server's step level
    (:func:`~..calibration.level.step_level`); None where the simulation has none (a simulator
    not timed by the predictor)."""

    def model(sim: Simulated) -> tuple[Predict, Any] | None:
        sim_cfg, inputs = scheduler_inputs(tuned, sim.candidate)
        built = model_for(tuned, sim.candidate, sim_cfg, inputs)
        if built is None:
            return None
        return built.step_s, built.serving

    return model


def at_step_level(tuned: TuneInputs) -> Callable[[Simulated, float], Simulated]:
    """For ``tune.verify``: a configuration's capacity simulated again with every step ``scale``
    times as long (``vidur.step_time_scale``: its server's measured step level), and where the
    engine runs on the host's CPU the front end too (``vidur.frontend_time_scale``, as the
    pipeline's and the fidelity stage's level: :func:`~..calibration.frontend_scale.
    follows_steps`), by a bracket search seeded at its simulated capacity; its points under
    ``points/at-level/<config_id>``."""

    def again(sim: Simulated, scale: float) -> Simulated:
        vidur, _ = at_level(tuned.inner.vidur, tuned.inner.hardware.device, scale)
        scaled = dataclasses.replace(
            tuned,
            inner=dataclasses.replace(tuned.inner, vidur=vidur),
            points_dir=tuned.points_dir / AT_LEVEL,
        )
        return one_configuration(scaled, sim.candidate, None, sim.capacity, False)

    return again
