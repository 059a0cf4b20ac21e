"""What each calibration experiment's steps cost, read off what the engine left behind: the
client's token times, or the engine's own step log and stamps; and the two things the bundle
keeps of them, one row per experiment (``engine_steps.csv``) and the spread of single decode
steps (``step_jitter``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.common import MIXED_START_FRACTION, windows
from gpu_simulate_test.calibration.experiments import Experiment
from gpu_simulate_test.core.engines import BackendError
from gpu_simulate_test.core.engines.records import STATUS_OK, BenchRequest, Recorder
from gpu_simulate_test.core.engines.vllm_log import step_cost_ms
from gpu_simulate_test.core.profiling.bundle import ENGINE_STEPS_TABLE, IDLE_PREFILL_PHASES

JITTER_PERCENTILES: tuple[float, ...] = (
    0, 0.5, 1, 2.5, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 97.5, 99, 99.5, 100,
)  # fmt: skip
"""Where the decode-step spread is recorded (finer in the tails, where the slow steps are)."""


def mixed_step(records: Sequence[Any]) -> list[float]:
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
    decode_tokens: int = 0,
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
        if exp.phase in IDLE_PREFILL_PHASES:
            rec = records[-1]  # a cached prefill's timed request (after its primer)
            assert rec.arrival_s is not None
            times.append(rec.event_times_s[0] - rec.arrival_s)
        elif exp.phase == "mixed":
            times.extend(mixed_step(records))
        elif exp.phase == "burst":
            for row, sample in burst_from_tokens(exp, records, decode_tokens):
                samples.setdefault(row, []).append(sample)
        else:
            # lockstep decoding: the second half of every request's inter-token gaps
            for rec in records:
                gaps = np.diff(rec.event_times_s)
                times.extend(gaps[len(gaps) // 2 :].tolist())
    return {exp: times for exp, times in samples.items() if times}


ONE_STEP_S = 0.001
"""A burst's first tokens within this of one another came from one step (client times)."""


def burst_row(exp: Experiment, prompts: int, decoders: int, context: int) -> Experiment:
    """The row a burst's step makes: ``prompts`` of its prompts prefilled alone (prefill) or
    next to ``decoders`` decodes of ``context`` tokens each (mixed)."""
    if decoders == 0:
        return Experiment("prefill", prompts, exp.prompt_tokens, num_prompts=prompts)
    return Experiment(
        "mixed",
        decoders,
        exp.prompt_tokens,
        exp.decode_prompt_tokens,
        num_prompts=prompts,
        context_tokens=context,
    )


def burst_context(exp: Experiment, decoders: int, decode_tokens: int) -> int:
    """The mean context of a burst step's decoders: the experiment's own decoders a third into
    their outputs (as a mixed experiment's), the rest newcomers that have just made their first
    token (their prompt and one)."""
    own = min(decoders, exp.batch_size)
    total = own * (exp.decode_prompt_tokens + decode_tokens // MIXED_START_FRACTION + 1)
    total += (decoders - own) * (exp.prompt_tokens + 1)
    return max(1, round(total / max(decoders, 1)))


def burst_from_tokens(
    exp: Experiment, records: Sequence[Any], decode_tokens: int
) -> list[tuple[Experiment, float]]:
    """A burst's multi-prompt step as the client sees it: only where every newcomer's first
    token came at once (one step carried them all, an in-process engine's queue); on an idle
    engine the step is arrival to first token (its wake-up included, as an idle prefill's), next
    to decoders their gap around it. Nothing where the first tokens came apart (the client cannot
    tell the steps)."""
    k = exp.num_prompts
    newcomers = records[-k:]
    firsts = [r.event_times_s[0] for r in newcomers if r.event_times_s]
    arrivals = [r.arrival_s for r in newcomers if r.arrival_s is not None]
    if len(firsts) < k or len(arrivals) < k or max(firsts) - min(firsts) > ONE_STEP_S:
        return []
    if exp.batch_size == 0:
        return [(burst_row(exp, k, 0, 0), max(firsts) - min(arrivals))]
    gaps = mixed_step([*records[: exp.batch_size], newcomers[-1]])
    row = burst_row(exp, k, exp.batch_size, burst_context(exp, exp.batch_size, decode_tokens))
    return [(row, g) for g in gaps]


def burst_from_log(
    exp: Experiment, steps: pd.DataFrame, rows: np.ndarray, cost_ms: np.ndarray, decode_tokens: int
) -> list[tuple[Experiment, float]]:
    """Every step of a burst's window that prefilled two or more of its prompts whole, by what
    it carried (its prompts, its decodes), at its full cost (seconds). A step without decodes is
    left out: on a server it is the step that woke the engine, whose cost the engine's stamps
    give, not its log."""
    prompts = steps["num_prefill_requests"].to_numpy()
    decoding = steps["num_decode_requests"].to_numpy()
    out = []
    for k in rows:
        if decoding[k] == 0:
            continue
        context = burst_context(exp, int(decoding[k]), decode_tokens)
        row = burst_row(exp, int(prompts[k]), int(decoding[k]), context)
        out.append((row, float(cost_ms[k]) / 1000.0))
    return out


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
        if exp.phase not in IDLE_PREFILL_PHASES:
            continue
        rec = recorder.records[group[-1].request_id]  # a cached prefill's timed request
        first = rec.engine_token_times_s[0] if rec.engine_token_times_s else None
        if rec.engine_arrival_s is None or first is None:
            return samples  # all or nothing: one source per calibration
        stamped.setdefault(exp, []).append(first - rec.engine_arrival_s)
    return {**samples, **stamped}


def check_cache_hits(
    experiments: Sequence[Experiment],
    groups: Sequence[Sequence[BenchRequest]],
    recorder: Recorder,
) -> None:
    """BackendError unless every cached prefill's timed request hit exactly its cached prefix,
    where the engine recorded a hit (the scheduler's at admission, the server's usage): vLLM
    hits whole blocks only and never the prompt's last token, so a prefix of whole blocks ahead
    of at least one more token is hit in full. Nothing recorded: accepted."""
    for exp, group in zip(experiments, groups, strict=True):
        if exp.phase != "cached_prefill":
            continue
        rec = recorder.records[group[-1].request_id]
        for source, hit in (
            ("the scheduler's admission", rec.engine_cached_tokens),
            ("the server's usage", rec.cached_tokens),
        ):
            if hit is not None and hit != exp.cached_tokens:
                raise BackendError(
                    f"engine calibration: a prefill of {exp.prompt_tokens} tokens over a cached "
                    f"prefix of {exp.cached_tokens} (request {rec.request_id}) hit "
                    f"{hit} cached tokens by {source}, expected {exp.cached_tokens} (is the "
                    "engine's prefix caching on, with the calibration's block size?)"
                )


def step_log_samples(
    experiments: Sequence[Experiment],
    starts: Sequence[float],
    steps: pd.DataFrame,
    decode_tokens: int = 0,
) -> dict[Experiment, list[float]]:
    """Every step's full cost (seconds) per distinct experiment, from the engine's own log.

    ``starts`` are the experiments' submit times and ``steps`` the logged steps (``time_s``),
    both in seconds from the recorder's origin; each experiment's steps are those of
    :func:`~.common.windows` (a prefill on an idle engine costs its own time plus the engine
    loop's median).
    """
    cost = step_cost_ms(steps)[0].to_numpy(dtype=float)
    samples: dict[Experiment, list[float]] = {}
    for _, exp, rows in windows(experiments, starts, steps):
        if exp.phase == "burst":  # rows by what each step carried
            for row, sample in burst_from_log(exp, steps, rows, cost, decode_tokens):
                samples.setdefault(row, []).append(sample)
            continue
        if exp.phase != "decode":
            rows = rows[:1]  # the prompt's one step (a repeat is another experiment)
        samples.setdefault(exp, []).extend((cost[rows] / 1000.0).tolist())
    return {exp: t for exp, t in samples.items() if t}


def step_rows(
    backend: str, samples: Mapping[Experiment, Sequence[float]], decode_tokens: int
) -> pd.DataFrame:
    """One row per distinct experiment: the median step time over its repeats."""
    rows = []
    for exp, times in samples.items():
        if exp.phase == "prefill":
            context = exp.prompt_tokens
        elif exp.phase == "cached_prefill":  # the step's KV: the cached prefix and the rest
            context = exp.cached_tokens + exp.prompt_tokens
        elif exp.phase == "decode":  # the middle of the timed half
            context = exp.prompt_tokens + (decode_tokens * 3) // 4
        elif exp.context_tokens:  # read off a burst
            context = exp.context_tokens
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
                "num_prompts": exp.num_prompts if exp.phase in ("prefill", "mixed") else 1,
            }
        )
    return pd.DataFrame(
        rows, columns=[*ENGINE_STEPS_TABLE.column_names, *ENGINE_STEPS_TABLE.optional_names]
    )


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


def decode_medians_ms(samples: Mapping[Experiment, Sequence[float]]) -> dict[int, float]:
    """Median decode step per batch size (client token gaps), for the capacity estimate."""
    shortest = min((e.prompt_tokens for e in samples if e.phase == "decode"), default=0)
    return {
        e.batch_size: float(np.median(t)) * 1e3
        for e, t in samples.items()
        if e.phase == "decode" and e.prompt_tokens == shortest and len(t)
    }
