"""Engine calibration: what one step of the real serving engine costs, timed end to end.

Vidur's per-op profile times a decoder layer's ops in isolation; a real engine step also runs the
embedding, the final norm, the LM head and sampling, and the engine's own Python (scheduling,
building inputs, streaming results). On a small model that part dominates (the LM head alone is
most of a decode step for the tiny model on CPU; the engine's Python for 0.6B on an H100).

The calibration drives the real bench's own backend, through the same interface the bench uses,
with two kinds of experiment, each alone on an idle engine:

- **prefill**: one request of P prompt tokens; its step time is arrival → first token;
- **decode**: B requests of the same length submitted together; once they all decode in lockstep
  (the second half of their outputs), the step time is the median inter-token time;
- **mixed**: B requests decoding, then one request of P prompt tokens arrives: the step that
  prefills it next to the B decodes is the decoders' inter-token gap that ends with its first
  token. On an idle engine (prefill) a request also pays for waking the engine up; a busy one
  (mixed) does not, and the two are modelled apart.

On an engine that logs its own steps (vLLM with ``--enable-logging-iteration-details``) the
step times come from that log instead of the client's token times: every step the experiment
ran, with its composition and its full cost (the step plus the engine loop around it, see
:func:`~gpu_simulate_test.core.engines.vllm_log.step_cost_ms`). What the client sees on top of an
idle prefill step is then the **front end** (HTTP, the API server, tokenization, the trip to the
engine and the stream back): measured apart as the time from send to the step's start
(``input_ms``) and from the step's end to the first token at the client (``output_ms``), and
simulated as a delay of every request's arrival at the scheduler and of every token's delivery,
not as part of a step (under load, a request pays it while other requests' steps run).

This module drives the engine; :mod:`.step_times` reads the steps' costs off what it left
behind, :mod:`.frontend` the front end, :mod:`.serving_replay` runs the replays under load. The
rows land in the bundle's ``engine_steps.csv`` (what the bundle holds is the record,
:mod:`.record`); ``vidur_simulate`` with
``vidur.engine_overhead=<backend>`` fits what Vidur's prediction misses on them and adds it to
every simulated batch (:mod:`gpu_simulate_test.calibration.overhead`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import frontend, serving_replay
from gpu_simulate_test.calibration.common import MIXED_START_FRACTION, random_prompt, wait
from gpu_simulate_test.calibration.experiments import Experiment
from gpu_simulate_test.calibration.record import CALIBRATION_VERSION
from gpu_simulate_test.calibration.step_times import (
    check_cache_hits,
    decode_medians_ms,
    idle_prefills_from_stamps,
    step_jitter,
    step_log_samples,
    step_rows,
    step_samples,
)
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.schema import HardwareConfig, ModelConfig
from gpu_simulate_test.config.vidur import EngineCalibrationConfig
from gpu_simulate_test.core.engines import get_backend, make_backend
from gpu_simulate_test.core.engines.harness import cpu_affinity, gc_paused, switch_interval
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder
from gpu_simulate_test.core.engines.step_record import step_log_rows
from gpu_simulate_test.core.engines.vllm_log import StepLog
from gpu_simulate_test.core.engines.warmup import single_token_requests, warmup_sizes
from gpu_simulate_test.core.host import host_probe

Lengths = tuple[np.ndarray, np.ndarray]
"""A served workload's prompt and output lengths (the calibration replays take them)."""


def bench_config(
    cfg: EngineCalibrationConfig, model: ModelConfig, hardware: HardwareConfig, dtype: str
) -> RealBenchStageConfig:
    """The real bench config the backend is built from (no workload: requests are synthetic)."""
    return RealBenchStageConfig(
        model=model,
        hardware=hardware,
        backend=cfg.backend,
        workload_dir="(engine calibration)",
        dtype=dtype,
        attn_implementation=cfg.attn_implementation,
        num_warmup_requests=0,
        nvtx=False,
        progress=False,
    )


def experiment_requests(
    experiments: Sequence[Experiment], decode_tokens: int, vocab_size: int, seed: int = 0
) -> list[list[BenchRequest]]:
    """Random-token requests per experiment, with ids unique across all of them.

    A cached_prefill's group is its primer, then the timed request: the primer's prompt is the
    cached prefix (C random ids) and one more id, so that its C tokens fill whole KV blocks the
    prefix cache keeps; the timed request's is the same C ids and T fresh ones. The primer's
    extra id differs from the timed request's next one, so the two share exactly C ids."""
    rng = np.random.default_rng(seed)
    groups: list[list[BenchRequest]] = []
    next_id = 0
    for exp in experiments:
        prompts: list[tuple[int, ...]]
        if exp.phase in ("mixed", "burst"):  # the decoders, then the newcomers (last)
            lengths = [exp.decode_prompt_tokens] * exp.batch_size + [
                exp.prompt_tokens
            ] * exp.num_prompts
            prompts = [random_prompt(rng, vocab_size, n) for n in lengths]
        elif exp.phase == "cached_prefill":  # the primer, then the timed request (last)
            prefix = random_prompt(rng, vocab_size, exp.cached_tokens)
            timed = prefix + random_prompt(rng, vocab_size, exp.prompt_tokens)
            after = timed[exp.cached_tokens]  # the primer's extra id is another
            prompts = [(*prefix, after - 1 if after > 0 else after + 1), timed]
        else:
            lengths = [exp.prompt_tokens] * exp.batch_size
            prompts = [random_prompt(rng, vocab_size, n) for n in lengths]
        group = []
        for prompt in prompts:
            group.append(
                BenchRequest(
                    request_id=next_id,
                    num_prefill_tokens=len(prompt),
                    num_decode_tokens=decode_tokens,
                    scheduled_arrival_s=0.0,
                    prompt_token_ids=prompt,
                )
            )
            next_id += 1
        groups.append(group)
    return groups


def prime(
    backend: Any,
    recorder: Recorder,
    exp: Experiment,
    group: Sequence[BenchRequest],
    timeout_s: float,
) -> Sequence[BenchRequest]:
    """A cached_prefill's primer (``group[0]``) run to its end, so that its prompt's prefix is
    in the prefix cache; returns the requests the experiment itself runs (the timed one; every
    request of any other experiment)."""
    if exp.phase != "cached_prefill":
        return group
    backend.submit(group[0])
    wait(backend, recorder, [group[0].request_id], timeout_s)
    return group[1:]


def run_experiment(
    backend: Any,
    recorder: Recorder,
    exp: Experiment,
    group: Sequence[BenchRequest],
    decode_tokens: int,
    timeout_s: float,
) -> None:
    """Submit one experiment's requests on an idle engine and wait until all are done: a mixed
    experiment's newcomer, and a burst's newcomers back to back, once its decoders (if any) are
    under way."""
    joining = exp.num_prompts if exp.phase in ("mixed", "burst") else 0
    decoders = list(group[: len(group) - joining])
    for req in decoders:
        backend.submit(req)
    if joining:
        if decoders:
            ids = [r.request_id for r in decoders]
            wait(backend, recorder, ids, timeout_s, decode_tokens // MIXED_START_FRACTION)
        for req in group[len(group) - joining :]:
            backend.submit(req)
    wait(backend, recorder, [r.request_id for r in group], timeout_s)


@dataclass(frozen=True)
class Driven:
    """What one calibration run left behind: the engine (closed), its requests and their
    recorder, when each experiment was submitted and when the last was done (seconds from the
    recorder's origin), the client's step samples, the replays under load and the host probe."""

    backend: Any
    groups: list[list[BenchRequest]]
    recorder: Recorder
    starts: list[float]
    experiments_end: float
    samples: dict[Experiment, list[float]]
    windows: list[tuple[float, float, float]]
    """(rate, first send, last token) per replay under load."""
    serving: dict[str, Any] | None
    """What the replays under load ran (None: none ran)."""
    probe: dict[str, Any]
    started_s: float
    """``time.perf_counter()`` when the run began."""


def drive(
    cfg: EngineCalibrationConfig,
    model: ModelConfig,
    hardware: HardwareConfig,
    dtype: str,
    experiments: Sequence[Experiment],
    advance: Callable[[int], None],
    lengths: Lengths | None,
    lengths_from: str | None,
) -> Driven:
    """Run ``experiments`` through ``cfg.backend``, each alone on an idle engine, then the
    calibration replays under load (:mod:`.serving_replay`); the engine is closed after."""
    bench = bench_config(cfg, model, hardware, dtype)
    groups = experiment_requests(experiments, cfg.decode_tokens, model.vocab_size)
    every = [r for g in groups for r in g]
    backend = (  # a fleet's engine beside its neighbours, else one engine alone
        make_backend(bench, calibrating=True)
        if cfg.beside_neighbours and int(getattr(cfg.backend, "servers", 1)) > 1
        else get_backend(cfg.backend.name)(bench)
    )
    backend.check(every)
    recorder = Recorder(every)
    starts: list[float] = []  # each experiment's submit, from the recorder's origin
    started = time.perf_counter()
    probe: dict[str, Any] = {}
    read_host = host_probe.reads_host(hardware.device, cfg.backend.host_probe)
    model_dims = (model.vocab_size, model.hidden_size)
    try:
        backend.start(recorder)
        # the model's first calls (allocation, kernels) are slow; warm-up reports to no recorder
        backend.warmup(groups[0] + calibration_shapes(cfg, experiments, model.vocab_size, lengths))
        if read_host:  # the host's memory speed, read as every real run reads it
            probe["before"] = host_probe.read(*model_dims, dtype, backend.client_cpus())
        recorder.origin = time.perf_counter()
        # as during the real bench's replay: the client on its own core (vLLM on CPU), the GIL
        # handed over as often, no garbage collection; unpinned, the replays' client streamed
        # on the engine's core and its steps came out 13% slower than the real bench's
        with (
            switch_interval(cfg.backend.gil_switch_interval_s),
            cpu_affinity(backend.client_cpus()),
            gc_paused(),
        ):
            timeout_s = cfg.backend.request_timeout_s
            for exp, group in zip(experiments, groups, strict=True):
                # a cached prefill's primer before its start: its window's first prompt step is
                # the timed request's, on an idle engine as a prefill's
                timed = prime(backend, recorder, exp, group, timeout_s)
                starts.append(recorder.rel(time.perf_counter()))
                run_experiment(backend, recorder, exp, timed, cfg.decode_tokens, timeout_s)
                advance(1)
            experiments_end = recorder.rel(time.perf_counter())
            prompts = [e.prompt_tokens for e in experiments if e.phase == "prefill"] or [1]
            samples = step_samples(experiments, groups, recorder, cfg.decode_tokens)
            windows, serving = serving_replay.replay_under_load(
                cfg,
                backend,
                recorder,
                decode_medians_ms(samples),
                (min(prompts), max(prompts)),
                model.vocab_size,
                lengths,
                lengths_from,
            )
        if read_host:
            probe["after"] = host_probe.read(*model_dims, dtype, backend.client_cpus())
    finally:
        backend.close()
    return Driven(
        backend,
        groups,
        recorder,
        starts,
        experiments_end,
        samples,
        windows,
        serving,
        probe,
        started,
    )


@dataclass(frozen=True)
class Reading:
    """The steps' costs a calibration keeps, where they came from, the front end and the
    replays' recorded steps."""

    samples: dict[Experiment, list[float]]
    source: str
    """``step_times_from``: client token times, engine step log or engine step record."""
    frontend: dict[str, Any] | None
    logged_steps: int
    serving_steps: pd.DataFrame | None
    """The replays under load's recorded steps (``serving_steps.csv``; None: none)."""


def read_steps(
    cfg: EngineCalibrationConfig, experiments: Sequence[Experiment], run: Driven
) -> Reading:
    """The step costs from the engine's own clock where it logs its steps (its step record where
    its scheduler records them, else its iteration log), and with them the front end; the
    client's token times otherwise."""
    recorder = run.recorder
    log: StepLog | None = getattr(run.backend, "steps", None)
    logged = log.frame(recorder.origin, recorder.origin) if log is not None else None
    if logged is not None:  # the experiments' steps (the replays under load come after)
        logged = logged[logged["time_s"] < run.experiments_end].reset_index(drop=True)
    reading = Reading(
        run.samples, "client token times", None, 0 if logged is None else len(logged), None
    )
    if logged is None or logged.empty:
        return reading
    recorded = recorded_all = frontend.recorded_schedule(run.backend, recorder)
    serving_table = None
    if recorded is not None:
        if run.windows:
            sends = [r.arrival_s for r in recorder.snapshot() if r.arrival_s is not None]
            serving_table = serving_replay.serving_steps(
                recorded, run.windows, cfg.backend.name, sends
            )
        recorded = recorded[recorded["end_time_s"] < run.experiments_end].reset_index(drop=True)
    reading = dataclasses.replace(reading, serving_steps=serving_table)
    costs, costs_from = (
        (logged, "engine step log")
        if recorded is None
        else (step_log_rows(recorded, timed=True), "engine step record")
    )
    from_log = step_log_samples(experiments, run.starts, costs, cfg.decode_tokens)
    if recorded is not None:
        from_log = idle_prefills_from_stamps(experiments, run.groups, recorder, from_log)
    if not {e.phase for e in from_log} >= {"prefill", "decode"}:
        return reading
    replays = (recorded_all, run.windows) if recorded_all is not None and run.windows else None
    front = frontend.measured(
        experiments, run.groups, recorder, run.starts, logged, recorded, replays
    )
    return dataclasses.replace(reading, samples=from_log, source=costs_from, frontend=front)


def calibrate(
    cfg: EngineCalibrationConfig,
    model: ModelConfig,
    hardware: HardwareConfig,
    dtype: str,
    experiments: Sequence[Experiment],
    advance: Callable[[int], None] = lambda _n: None,
    lengths: Lengths | None = None,
    lengths_from: str | None = None,
) -> tuple[pd.DataFrame, dict[str, Any], pd.DataFrame | None]:
    """Run ``experiments`` (:func:`plan_experiments`) through ``cfg.backend``, then the
    calibration replays under load (:mod:`.serving_replay`); return the rows, what was run and
    the replays' recorded steps (None without them). ``lengths``: the served workload's prompt
    and output lengths, for the replays."""
    run = drive(cfg, model, hardware, dtype, experiments, advance, lengths, lengths_from)
    check_cache_hits(experiments, run.groups, run.recorder)
    reading = read_steps(cfg, experiments, run)
    rows = step_rows(cfg.backend.name, reading.samples, cfg.decode_tokens)
    info = {
        "version": CALIBRATION_VERSION,
        "settings": dataclasses.asdict(cfg),
        "backend": dataclasses.asdict(cfg.backend),
        "attn_implementation": cfg.attn_implementation,
        "dtype": dtype,
        "decode_tokens": cfg.decode_tokens,
        "repeats": cfg.repeats,
        "num_experiments": len(experiments),
        "experiments": sorted({experiment_key(e) for e in experiments}),
        "wall_time_s": round(time.perf_counter() - run.started_s, 3),
        "engine": run.backend.describe(),
        "step_jitter": step_jitter(reading.samples),
        "step_times_from": reading.source,
        "frontend": reading.frontend,
        "logged_steps": reading.logged_steps,
        "serving": run.serving,
        "host_probe": host_probe.calibration_reading(run.probe),
    }
    return rows, info, reading.serving_steps


def experiment_key(exp: Experiment) -> tuple[str | int, ...]:
    """What meta.json's ``experiments`` lists of an experiment: phase, batch size and prompt,
    a burst's prompts and a cached prefill's cached prefix."""
    key: tuple[str | int, ...] = (exp.phase, exp.batch_size, exp.prompt_tokens)
    if exp.phase == "burst":
        return (*key, exp.num_prompts)
    return (*key, exp.cached_tokens) if exp.phase == "cached_prefill" else key


def calibration_shapes(
    cfg: EngineCalibrationConfig,
    experiments: Sequence[Experiment],
    vocab_size: int,
    lengths: Lengths | None = None,
) -> list[BenchRequest]:
    """The real bench's shape warm-up (``backend.warmup_shapes``) for the calibration: one
    single-token request per step size its experiments and replays under load can meet, so
    that neither times an engine's first step of a size (one-time costs the judged run, warmed
    the same way, does not pay); none when the backend's warm-up is off."""
    if not cfg.backend.warmup_shapes:
        return []
    longest = max(e.cached_tokens + e.prompt_tokens for e in experiments)
    outputs = max(serving_replay.output_range(cfg)[1], cfg.decode_tokens)
    if lengths is not None and len(lengths[0]):
        longest = max(longest, int(np.max(lengths[0])))
        outputs = max(outputs, int(np.max(lengths[1])))
    sizes = warmup_sizes(longest, longest + outputs, *cfg.backend.step_limits())
    rng = np.random.default_rng(cfg.serving_seed + 1)
    return single_token_requests(sizes, lambda size: random_prompt(rng, vocab_size, size))
