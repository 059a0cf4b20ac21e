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

The rows land in the bundle's ``engine_steps.csv``; ``vidur_simulate`` with
``vidur.engine_overhead=<backend>`` fits what Vidur's prediction misses on them and adds it to
every simulated batch (:mod:`gpu_simulate_test.calibration.overhead`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import serving_replay
from gpu_simulate_test.calibration.experiments import Experiment
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.schema import HardwareConfig, ModelConfig
from gpu_simulate_test.config.vidur import EngineCalibrationConfig
from gpu_simulate_test.core import host_probe
from gpu_simulate_test.core.bundle import ENGINE_STEPS_TABLE
from gpu_simulate_test.core.engines import BackendError, get_backend
from gpu_simulate_test.core.engines.harness import cpu_affinity, gc_paused, switch_interval
from gpu_simulate_test.core.engines.records import STATUS_OK, BenchRequest, Recorder
from gpu_simulate_test.core.engines.step_record import step_log_rows
from gpu_simulate_test.core.engines.vllm_log import StepLog, step_cost_ms
from gpu_simulate_test.core.warmup import single_token_requests, warmup_sizes

CALIBRATION_VERSION = 9
"""Bumped when what the calibration measures changes (2: every batch size up to 16, mixed
steps; 3: at least 64 timed steps per decode row; 4: the spread of decode steps,
``step_jitter``, and the experiments interleaved in rounds; 5: on an engine that logs its steps
(vLLM), step times from that log and the front end's latency apart; 6: on a vLLM server that
records its steps, step times and the front end from the engine's own clock, the log's reading
kept as a check; 7: calibration replays under load, ``serving_steps.csv``; 8: the front end
as a queue fitted on those replays, ``frontend.queue``; 9: after a warm-up of every step size,
:func:`calibration_shapes`); a bundle calibrated by another version
is not reused by the pipeline."""
MIXED_START_FRACTION = 3
"""mixed: the newcomer arrives once the decoders have a third of their outputs."""
POLL_S = 0.01
JITTER_PERCENTILES: tuple[float, ...] = (
    0, 0.5, 1, 2.5, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 97.5, 99, 99.5, 100,
)  # fmt: skip
"""Where the decode-step spread is recorded (finer in the tails, where the slow steps are)."""


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


def _requests(
    experiments: Sequence[Experiment], decode_tokens: int, vocab_size: int, seed: int = 0
) -> list[list[BenchRequest]]:
    """Random-token requests per experiment, with ids unique across all of them."""
    rng = np.random.default_rng(seed)
    groups: list[list[BenchRequest]] = []
    next_id = 0
    for exp in experiments:
        group = []
        if exp.phase == "mixed":  # the decoders, then the newcomer (last)
            lengths = [exp.decode_prompt_tokens] * exp.batch_size + [exp.prompt_tokens]
        else:
            lengths = [exp.prompt_tokens] * exp.batch_size
        for length in lengths:
            group.append(
                BenchRequest(
                    request_id=next_id,
                    num_prefill_tokens=length,
                    num_decode_tokens=decode_tokens,
                    scheduled_arrival_s=0.0,
                    prompt_token_ids=random_prompt(rng, vocab_size, length),
                )
            )
            next_id += 1
        groups.append(group)
    return groups


def random_prompt(rng: np.random.Generator, vocab_size: int, length: int) -> tuple[int, ...]:
    """``length`` random token ids (below 32,000 and the vocabulary)."""
    return tuple(int(t) for t in rng.integers(0, min(vocab_size, 32_000), length))


def _wait(
    backend: Any,
    recorder: Recorder,
    ids: Sequence[int],
    timeout_s: float,
    min_tokens: int | None = None,
    during: str = "engine calibration",
    what: str = "engine calibration step",
) -> None:
    """Until every request in ``ids`` is done (or, with ``min_tokens``, has that many tokens);
    BackendError naming ``during`` when the engine dies, ``what`` when it runs out of time."""

    def ready(i: int) -> bool:
        rec = recorder.records[i]
        if min_tokens is None:
            return rec.is_done
        return rec.is_done or len(rec.event_times_s) >= min_tokens

    deadline = time.perf_counter() + timeout_s
    while not all(ready(i) for i in ids):
        if (why := backend.failure()) is not None:
            raise BackendError(f"{backend.name} died during {during}: {why}")
        if time.perf_counter() > deadline:
            raise BackendError(f"{what} not done within {timeout_s:g} s")
        recorder.wait_for_change(POLL_S)


def _mixed_step(records: Sequence[Any]) -> list[float]:
    """Per decoder: its inter-token gap ending closest to the newcomer's first token."""
    first = records[-1].event_times_s[0]
    gaps = []
    for rec in records[:-1]:
        times = np.asarray(rec.event_times_s)
        k = int(np.argmin(np.abs(times - first)))
        if k >= 1:
            gaps.append(float(times[k] - times[k - 1]))
    return gaps


def step_samples(
    experiments: Sequence[Experiment],
    groups: Sequence[Sequence[BenchRequest]],
    recorder: Recorder,
) -> dict[Experiment, list[float]]:
    """Every timed step (seconds) per distinct experiment, over its repeats."""
    samples: dict[Experiment, list[float]] = {}
    for exp, group in zip(experiments, groups, strict=True):
        records = [recorder.records[r.request_id] for r in group]
        for rec in records:
            if rec.status != STATUS_OK:
                raise BackendError(
                    f"calibration request {rec.request_id} ended {rec.status}: {rec.error}"
                )
        times = samples.setdefault(exp, [])
        if exp.phase == "prefill":
            rec = records[0]
            assert rec.arrival_s is not None
            times.append(rec.event_times_s[0] - rec.arrival_s)
        elif exp.phase == "mixed":
            times.extend(_mixed_step(records))
        else:
            # lockstep decoding: the second half of every request's inter-token gaps
            for rec in records:
                gaps = np.diff(rec.event_times_s)
                times.extend(gaps[len(gaps) // 2 :].tolist())
    return {exp: times for exp, times in samples.items() if times}


def idle_prefills_from_stamps(
    experiments: Sequence[Experiment],
    groups: Sequence[Sequence[BenchRequest]],
    recorder: Recorder,
    samples: dict[Experiment, list[float]],
) -> dict[Experiment, list[float]]:
    """``samples`` with every idle prefill's time replaced, where the engine stamped its prompt,
    by the engine's own time from queueing the prompt to its first token: what a simulated step
    on an idle engine costs from the request's arrival at the scheduler, the engine's wake-up
    included (the step record's step starts after it)."""
    stamped: dict[Experiment, list[float]] = {}
    for exp, group in zip(experiments, groups, strict=True):
        if exp.phase != "prefill":
            continue
        rec = recorder.records[group[0].request_id]
        first = rec.engine_token_times_s[0] if rec.engine_token_times_s else None
        if rec.engine_arrival_s is None or first is None:
            return samples  # all or nothing: one source per calibration
        stamped.setdefault(exp, []).append(first - rec.engine_arrival_s)
    return {**samples, **stamped}


def step_rows(
    backend: str, samples: Mapping[Experiment, Sequence[float]], decode_tokens: int
) -> pd.DataFrame:
    """One row per distinct experiment: the median step time over its repeats."""
    rows = []
    for exp, times in samples.items():
        if exp.phase == "prefill":
            context = exp.prompt_tokens
        elif exp.phase == "decode":  # the middle of the timed half
            context = exp.prompt_tokens + (decode_tokens * 3) // 4
        else:  # the decoders' context when the newcomer arrives
            context = exp.decode_prompt_tokens + decode_tokens // MIXED_START_FRACTION + 1
        rows.append(
            {
                "backend": backend,
                "phase": exp.phase,
                "batch_size": exp.num_requests,
                "num_q_tokens": 1 if exp.phase == "decode" else exp.prompt_tokens,
                "context_tokens": context,
                "step_ms": float(np.median(times)) * 1e3,
                "samples": len(times),
            }
        )
    return pd.DataFrame(rows, columns=ENGINE_STEPS_TABLE.column_names)


def step_jitter(samples: Mapping[Experiment, Sequence[float]]) -> dict[str, Any] | None:
    """The spread of decode steps around their row's median, every decode row weighted alike.

    Each decode gap is divided by the median of its row (``step_ms``); the percentiles
    (``JITTER_PERCENTILES``) of each row's ratios are averaged over the rows, so a batch of 32,
    whose lockstep step is seen by 32 requests, counts as much as a batch of 1. A zero gap (two
    tokens in one event) is no step and is left out. ``vidur.step_jitter`` draws a factor for every
    simulated step from this: the rows' medians make the model, this is how far single steps
    stray from them (the OS, the allocator, the garbage collector), which per-request TPOT and
    its p90 carry and a deterministic simulator does not. None without decode samples.
    """
    rows = []
    for exp, times in samples.items():
        gaps = np.asarray(times, dtype=float)
        gaps = gaps[gaps > 0]
        if exp.phase == "decode" and gaps.size:
            rows.append(gaps / np.median(gaps))
    if not rows:
        return None
    curves = np.array([np.percentile(r, JITTER_PERCENTILES) for r in rows])
    return {
        "percentiles": list(JITTER_PERCENTILES),
        "ratios": [round(float(v), 6) for v in curves.mean(axis=0)],
        "mean_ratio": round(float(np.mean([r.mean() for r in rows])), 6),
        "rows": len(rows),
        "samples": int(sum(r.size for r in rows)),
    }


def _windows(
    experiments: Sequence[Experiment], starts: Sequence[float], steps: pd.DataFrame
) -> Iterator[tuple[int, Experiment, np.ndarray]]:
    """``(i, experiment, rows)`` for every experiment run: the positions in ``steps`` of the
    steps of exactly its composition, logged in its window (its start to the next one's).

    decode: the steps that decoded exactly the batch and nothing else; prefill: the prompt on its
    own; mixed: the prompt next to the decoders."""
    times = steps["time_s"].to_numpy(dtype=float)
    prompt = steps["num_prefill_tokens"].to_numpy()
    decoding = steps["num_decode_requests"].to_numpy()
    bounds = [*starts[1:], float("inf")]
    for i, (exp, lo, hi) in enumerate(zip(experiments, starts, bounds, strict=True)):
        inside = (times >= lo) & (times < hi)
        if exp.phase == "decode":
            chosen = (prompt == 0) & (decoding == exp.batch_size)
        elif exp.phase == "prefill":
            chosen = (prompt == exp.prompt_tokens) & (decoding == 0)
        else:
            chosen = (prompt == exp.prompt_tokens) & (decoding == exp.batch_size)
        yield i, exp, np.flatnonzero(inside & chosen)


def step_log_samples(
    experiments: Sequence[Experiment],
    starts: Sequence[float],
    steps: pd.DataFrame,
) -> dict[Experiment, list[float]]:
    """Every step's full cost (seconds) per distinct experiment, from the engine's own log.

    ``starts`` are the experiments' submit times and ``steps`` the logged steps (``time_s``),
    both in seconds from the recorder's origin; each experiment's steps are those of
    :func:`_windows` (a prefill on an idle engine costs its own time plus the engine loop's
    median).
    """
    cost = step_cost_ms(steps)[0].to_numpy(dtype=float)
    samples: dict[Experiment, list[float]] = {}
    for _, exp, rows in _windows(experiments, starts, steps):
        if exp.phase != "decode":
            rows = rows[:1]  # the prompt's one step (a repeat is another experiment)
        samples.setdefault(exp, []).extend((cost[rows] / 1000.0).tolist())
    return {exp: t for exp, t in samples.items() if t}


def _run_experiment(
    backend: Any,
    recorder: Recorder,
    exp: Experiment,
    group: Sequence[BenchRequest],
    decode_tokens: int,
    timeout_s: float,
) -> None:
    """Submit one experiment's requests on an idle engine and wait until all are done."""
    decoders = list(group[:-1] if exp.phase == "mixed" else group)
    for req in decoders:
        backend.submit(req)
    if exp.phase == "mixed":  # the newcomer, once the decoders are under way
        ids = [r.request_id for r in decoders]
        _wait(backend, recorder, ids, timeout_s, decode_tokens // MIXED_START_FRACTION)
        backend.submit(group[-1])
    _wait(backend, recorder, [r.request_id for r in group], timeout_s)


def calibrate(
    cfg: EngineCalibrationConfig,
    model: ModelConfig,
    hardware: HardwareConfig,
    dtype: str,
    experiments: Sequence[Experiment],
    advance: Callable[[int], None] = lambda _n: None,
    lengths: tuple[np.ndarray, np.ndarray] | None = None,
    lengths_from: str | None = None,
) -> tuple[pd.DataFrame, dict[str, Any], pd.DataFrame | None]:
    """Run ``experiments`` (:func:`plan_experiments`) through ``cfg.backend``, then the
    calibration replays under load (:mod:`.serving_replay`); return the rows, what was run and
    the replays' recorded steps (None without them). ``lengths``: the served workload's prompt
    and output lengths, for the replays."""
    bench = bench_config(cfg, model, hardware, dtype)
    groups = _requests(experiments, cfg.decode_tokens, model.vocab_size)
    every = [r for g in groups for r in g]
    backend = get_backend(cfg.backend.name)(bench)
    backend.check(every)
    recorder = Recorder(every)
    starts: list[float] = []  # each experiment's submit, from the recorder's origin
    started = time.perf_counter()
    interval = cfg.backend.gil_switch_interval_s
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
        with switch_interval(interval), cpu_affinity(backend.client_cpus()), gc_paused():
            for exp, group in zip(experiments, groups, strict=True):
                starts.append(recorder.rel(time.perf_counter()))
                _run_experiment(
                    backend, recorder, exp, group, cfg.decode_tokens, cfg.backend.request_timeout_s
                )
                advance(1)
            experiments_end = recorder.rel(time.perf_counter())
            prompts = [e.prompt_tokens for e in experiments if e.phase == "prefill"] or [1]
            samples = step_samples(experiments, groups, recorder)
            windows, serving = serving_replay.replay_under_load(
                cfg,
                backend,
                recorder,
                _decode_medians_ms(samples),
                (min(prompts), max(prompts)),
                model.vocab_size,
                lengths,
                lengths_from,
            )
        if read_host:
            probe["after"] = host_probe.read(*model_dims, dtype, backend.client_cpus())
    finally:
        backend.close()
    frontend, source = None, "client token times"
    log: StepLog | None = getattr(backend, "steps", None)
    logged = log.frame(recorder.origin, recorder.origin) if log is not None else None
    if logged is not None:  # the experiments' steps (the replays under load come after)
        logged = logged[logged["time_s"] < experiments_end].reset_index(drop=True)
    serving_table = None
    if logged is not None and not logged.empty:
        from gpu_simulate_test.calibration.frontend import (
            checked,
            frontend_from_engine_clock,
            frontend_latency,
            queue_from_replays,
            recorded_schedule,
        )

        # step costs from the engine's own clock where its scheduler recorded the steps
        recorded = recorded_all = recorded_schedule(backend, recorder)
        if recorded is not None:
            if windows:
                serving_table = serving_replay.serving_steps(recorded, windows, cfg.backend.name)
            recorded = recorded[recorded["end_time_s"] < experiments_end].reset_index(drop=True)
        costs, costs_from = (
            (logged, "engine step log")
            if recorded is None
            else (step_log_rows(recorded, timed=True), "engine step record")
        )
        from_log = step_log_samples(experiments, starts, costs)
        if recorded is not None:
            from_log = idle_prefills_from_stamps(experiments, groups, recorder, from_log)
        if {e.phase for e in from_log} >= {"prefill", "decode"}:
            samples, source = from_log, costs_from
            frontend = frontend_latency(experiments, groups, recorder, starts, logged)
            spans = None
            if recorded is not None:
                spans = recorded[["start_time_s", "end_time_s"]].to_numpy(dtype=float)
            stamped = frontend_from_engine_clock(  # exact where the engine stamps
                experiments, groups, recorder, spans
            )
            if stamped is not None:
                frontend = checked(stamped, frontend)
            if frontend is not None and recorded_all is not None and windows:
                frontend["queue"] = queue_from_replays(recorder, recorded_all, windows)
    rows = step_rows(cfg.backend.name, samples, cfg.decode_tokens)
    info = {
        "version": CALIBRATION_VERSION,
        "settings": dataclasses.asdict(cfg),
        "backend": dataclasses.asdict(cfg.backend),
        "attn_implementation": cfg.attn_implementation,
        "dtype": dtype,
        "decode_tokens": cfg.decode_tokens,
        "repeats": cfg.repeats,
        "num_experiments": len(experiments),
        "experiments": sorted({(e.phase, e.batch_size, e.prompt_tokens) for e in experiments}),
        "wall_time_s": round(time.perf_counter() - started, 3),
        "engine": backend.describe(),
        "step_jitter": step_jitter(samples),
        "step_times_from": source,
        "frontend": frontend,
        "logged_steps": 0 if logged is None else len(logged),
        "serving": serving,
        "host_probe": host_probe.calibration_reading(probe),
    }
    return rows, info, serving_table


def calibration_shapes(
    cfg: EngineCalibrationConfig,
    experiments: Sequence[Experiment],
    vocab_size: int,
    lengths: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[BenchRequest]:
    """The real bench's shape warm-up (``backend.warmup_shapes``) for the calibration: one
    single-token request per step size its experiments and replays under load can meet, so
    that neither times an engine's first step of a size (one-time costs the judged run, warmed
    the same way, does not pay); none when the backend's warm-up is off."""
    if not cfg.backend.warmup_shapes:
        return []
    longest = max(e.prompt_tokens for e in experiments)
    outputs = max(serving_replay.output_range(cfg)[1], cfg.decode_tokens)
    if lengths is not None and len(lengths[0]):
        longest = max(longest, int(np.max(lengths[0])))
        outputs = max(outputs, int(np.max(lengths[1])))
    sizes = warmup_sizes(
        longest, longest + outputs, cfg.backend.max_batch_tokens, cfg.backend.max_requests_per_batch
    )
    rng = np.random.default_rng(cfg.serving_seed + 1)
    return single_token_requests(sizes, lambda size: random_prompt(rng, vocab_size, size))


def _decode_medians_ms(samples: Mapping[Experiment, Sequence[float]]) -> dict[int, float]:
    """Median decode step per batch size (client token gaps), for the capacity estimate."""
    return {
        e.batch_size: float(np.median(t)) * 1e3
        for e, t in samples.items()
        if e.phase == "decode" and len(t)
    }
