"""Calibration replays under load: the engine's steps while it serves, for the serving terms.

After the engine calibration's experiments (each alone on an idle engine), the same server
replays short Poisson workloads at a few rates (``engine.serving_rates``, fractions of the
capacity the decode experiments imply), in interleaved rounds, seeded by ``engine.serving_seed``,
apart from any workload a simulation is judged on. Their lengths are those of the workload the
profile is for (``workload_dir``: the shape that will be served, its lengths drawn anew), else
uniform. The engine's own step record of those replays lands in the
bundle's ``serving_steps.csv``; ``vidur_simulate`` fits what serving adds to a step's time on them
(:mod:`.serving_load`), and the bundle's ``step_residuals.png`` shows what
besides a step's composition moves its time.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration.common import random_prompt, wait
from gpu_simulate_test.calibration.intake_phase import CLIENT_SEND_OFFSETS, offsets_within
from gpu_simulate_test.calibration.serving_load import CLIENT_SENDS
from gpu_simulate_test.config.vidur import EngineCalibrationConfig
from gpu_simulate_test.core.engines.harness import spin_window_s, wait_until
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder

START_LEAD_S = 0.05


def sends_within(sent: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per step [start, end): how many of the sorted send times ``sent`` fall inside it."""
    return np.searchsorted(sent, end, side="left") - np.searchsorted(sent, start, side="left")


def with_sends(schedule: pd.DataFrame, sent: np.ndarray) -> pd.DataFrame:
    """``schedule`` (an ``engine_schedule`` table) with each step's ``client_sends`` and their
    offsets into it (:data:`~.intake_phase.CLIENT_SEND_OFFSETS`) from the sorted send times
    ``sent`` on the schedule's clock."""
    start = schedule["start_time_s"].to_numpy(dtype=float)
    end = schedule["end_time_s"].to_numpy(dtype=float)
    out = schedule.copy()
    out[CLIENT_SENDS] = sends_within(sent, start, end)
    out[CLIENT_SEND_OFFSETS] = offsets_within(sent, start, end)
    return out


@dataclass(frozen=True)
class ServingReplay:
    """One rate's requests (their arrivals on the recorder's clock, set when it runs)."""

    rate_qps: float
    requests: tuple[BenchRequest, ...]


def capacity_qps(decode_steps_ms: Mapping[int, float], mean_output_tokens: float) -> float | None:
    """Requests per second the engine could serve at its best decode throughput (batch size →
    step time), each producing ``mean_output_tokens``; None without decode steps."""
    if not decode_steps_ms or mean_output_tokens <= 0:
        return None
    best = max(b / (ms / 1e3) for b, ms in decode_steps_ms.items() if ms > 0)
    return best / mean_output_tokens


def output_range(cfg: EngineCalibrationConfig) -> tuple[int, int]:
    """The calibration replays' output lengths: from a quarter of ``decode_tokens`` (at least
    2) to twice it."""
    return max(2, cfg.decode_tokens // 4), 2 * cfg.decode_tokens


def plan(
    cfg: EngineCalibrationConfig,
    capacity: float,
    prompt_range: tuple[int, int],
    vocab_size: int,
    first_id: int,
    lengths: tuple[np.ndarray, np.ndarray] | None = None,
) -> list[ServingReplay]:
    """Poisson replays at ``cfg.serving_rates`` × ``capacity`` (every rate once per round, for
    ``cfg.serving_rounds`` rounds), each ``cfg.serving_duration_s``
    long (at most ``cfg.serving_max_requests``); prompts uniform over ``prompt_range``, outputs
    over :func:`output_range` (short ones among them: many requests per second, each with the
    API server's per-request work). With ``lengths`` (a workload's prompt and output lengths),
    each request takes the lengths of one of its requests, drawn with the same seed: the shape
    that will be served, never its arrivals."""
    rng = np.random.default_rng(cfg.serving_seed)
    replays, next_id = [], first_id
    out_lo, out_hi = output_range(cfg)
    lo, hi = prompt_range
    for fraction in [f for _ in range(cfg.serving_rounds) for f in cfg.serving_rates]:
        rate = fraction * capacity
        count = int(min(cfg.serving_max_requests, max(8, round(rate * cfg.serving_duration_s))))
        gaps = rng.exponential(1.0 / rate, count)
        arrivals = np.cumsum(gaps) - gaps[0]
        requests = []
        for t in arrivals:
            if lengths is None:
                prompt = int(rng.integers(lo, hi + 1))
                output = int(rng.integers(out_lo, out_hi + 1))
            else:
                k = int(rng.integers(0, len(lengths[0])))
                prompt, output = int(lengths[0][k]), int(lengths[1][k])
            requests.append(
                BenchRequest(
                    request_id=next_id,
                    num_prefill_tokens=prompt,
                    num_decode_tokens=output,
                    scheduled_arrival_s=float(t),
                    prompt_token_ids=random_prompt(rng, vocab_size, prompt),
                )
            )
            next_id += 1
        replays.append(ServingReplay(rate, tuple(requests)))
    return replays


def run(
    backend: Any, recorder: Recorder, replays: Sequence[ServingReplay], timeout_s: float
) -> list[tuple[float, float, float]]:
    """Replay each rate's requests at their arrivals (after the previous rate's are done);
    returns (rate, first send, last token) per replay on the recorder's clock."""
    windows = []
    # as the real bench sends (2 ms spun against a server: 1.6% slower steps at half the
    # capacity, within the noise, but not the truth's way of sending)
    spin = spin_window_s(backend)
    for replay in replays:
        origin = time.perf_counter() + START_LEAD_S
        for req in replay.requests:
            wait_until(origin + req.scheduled_arrival_s, spin)
            backend.submit(req)
        ids = [r.request_id for r in replay.requests]
        wait(
            backend,
            recorder,
            ids,
            timeout_s,
            during="a calibration replay",
            what="calibration replay",
        )
        windows.append((replay.rate_qps, recorder.rel(origin), recorder.rel(time.perf_counter())))
    return windows


def replay_under_load(
    cfg: EngineCalibrationConfig,
    backend: Any,
    recorder: Recorder,
    decode_steps_ms: Mapping[int, float],
    prompt_range: tuple[int, int],
    vocab_size: int,
    lengths: tuple[np.ndarray, np.ndarray] | None = None,
    lengths_from: str | None = None,
) -> tuple[list[tuple[float, float, float]], dict[str, Any] | None]:
    """Run the calibration replays on a server that records its steps (none on another
    engine, or with ``engine.serving_rates=[]``); returns their windows and what ran."""
    if not cfg.serving_rates or getattr(backend, "steps_path", None) is None:
        return [], None
    out_lo, out_hi = output_range(cfg)
    mean_output = (out_lo + out_hi) / 2.0 if lengths is None else float(np.mean(lengths[1]))
    capacity = capacity_qps(decode_steps_ms, mean_output)
    if capacity is None:
        return [], None
    first_id = max(recorder.records) + 1
    replays = plan(cfg, capacity, prompt_range, vocab_size, first_id, lengths)
    recorder.add([r for replay in replays for r in replay.requests])
    windows = run(backend, recorder, replays, cfg.backend.request_timeout_s)
    info = {
        "seed": cfg.serving_seed,
        "capacity_qps_estimate": round(capacity, 3),
        "rates_qps": [round(r.rate_qps, 3) for r in replays],
        "requests": [len(r.requests) for r in replays],
        "rounds": cfg.serving_rounds,
        "lengths_from": lengths_from or "uniform",
        "prompt_tokens": list(prompt_range) if lengths is None else _span(lengths[0]),
        "output_tokens": [out_lo, out_hi] if lengths is None else _span(lengths[1]),
    }
    return windows, info


def _span(values: np.ndarray) -> list[int]:
    return [int(np.min(values)), int(np.max(values))]


def serving_steps(
    schedule: pd.DataFrame,
    windows: Sequence[tuple[float, float, float]],
    backend: str,
    sends_s: Sequence[float] = (),
) -> pd.DataFrame:
    """The recorded steps inside each replay's window, with the backend and the rate; and,
    given the client's sends (``sends_s``, on the schedule's clock), each step's
    ``client_sends``: how many requests the client sent while it ran (the API server takes
    them in on the cores the engine computes on), and how far into it each fell."""
    sent = np.sort(np.asarray([s for s in sends_s if s == s], dtype=float))
    parts = []
    for index, (rate, start, end) in enumerate(windows):
        inside = schedule[(schedule["start_time_s"] >= start) & (schedule["end_time_s"] <= end)]
        part = inside.copy()
        if len(sent):
            part = with_sends(part, sent)
        part.insert(0, "replay", index)
        part.insert(0, "rate_qps", rate)
        part.insert(0, "backend", backend)
        parts.append(part)
    if not parts:
        return pd.DataFrame()
    return pd.concat(parts, ignore_index=True)


def _over_composition(steps: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    """The replays' step features (each replay apart), their steps in that order, and each
    step's time over the median step of its composition."""
    from gpu_simulate_test.calibration import serving_load

    parts = [part.reset_index(drop=True) for _, part in steps.groupby("replay", sort=False)]
    frame = pd.concat([serving_load.step_features(p) for p in parts], ignore_index=True)
    every = pd.concat(parts, ignore_index=True)
    ratio = frame["body_s"].to_numpy() / composition_medians(every, frame)
    return frame, every, ratio


def bundle_report(steps: pd.DataFrame, plot_path: Any) -> dict[str, Any]:
    """What besides composition moves a step: the residual analysis of the replays' steps
    against the median step of the same composition, and its plot."""
    from gpu_simulate_test.calibration import serving_residuals

    frame, every, ratio = _over_composition(steps)
    serving_residuals.plot_residuals(
        frame,
        ratio,
        plot_path,
        "calibration replays: step time over the median step of its composition",
        "median of its composition",
    )
    by_replay = [
        {
            "replay": int(replay),
            "rate_qps": float(rate),
            "steps": int(mask.sum()),
            "mean_ratio": float(np.nanmean(ratio[mask])),
        }
        for (replay, rate), mask in _replay_masks(every)
    ]
    by_rate = []
    rates = every["rate_qps"].to_numpy()
    for rate in dict.fromkeys(rates.tolist()):
        mask = rates == rate
        by_rate.append(
            {
                "rate_qps": float(rate),
                "steps": int(mask.sum()),
                "mean_ratio": float(np.nanmean(ratio[mask])),
                "busy_gap_ms": float(np.nanmean(frame["gap_s"].to_numpy()[mask]) * 1e3),
            }
        )
    return {
        "model": "the median step of the same composition over every replay",
        "residuals": serving_residuals.residual_analysis(frame, ratio),
        "by_rate": by_rate,
        "by_replay": by_replay,
        "drift": drift(by_replay),
    }


DRIFT_LIMIT = 0.40
"""Rounds of one rate whose mean step (over the median of its composition) differ by more than
this: the host's speed moved during the calibration by more than a quiet host's does (it is
redone once, then marked in ``serving.drift_note`` and judged by the validation replay). On the
project's 2 shared cores with nothing else running, the rounds of every calibration recorded
moved 10-34% (12-14% in three on 2026-11-25; 10, 15, 18, 27, 34 and 34% on 2026-11-26, each in
both of its attempts): at the earlier limit of 10% every calibration was redone, 58 s for
nothing, and calibration plus validation took 140-161 s instead of about 80."""


def _replay_masks(every: pd.DataFrame) -> list[tuple[tuple[int, float], np.ndarray]]:
    replays = every["replay"].to_numpy()
    rates = every["rate_qps"].to_numpy()
    return [
        ((int(r), float(rates[replays == r][0])), replays == r)
        for r in dict.fromkeys(replays.tolist())
    ]


def drift(by_replay: Sequence[Mapping[str, Any]]) -> float:
    """The largest spread, over rates, of the rounds' mean ratios: (max - min) / median."""
    worst = 0.0
    for rate in {r["rate_qps"] for r in by_replay}:
        ratios = [r["mean_ratio"] for r in by_replay if r["rate_qps"] == rate and r["steps"] >= 20]
        if len(ratios) >= 2:
            worst = max(worst, (max(ratios) - min(ratios)) / float(np.median(ratios)))
    return worst


def replay_drift(steps: pd.DataFrame) -> float:
    """:func:`drift` of the calibration replays' steps (0 with a single round)."""
    _, every, ratio = _over_composition(steps)
    return drift(
        [
            {
                "rate_qps": rate,
                "steps": int(mask.sum()),
                "mean_ratio": float(np.nanmean(ratio[mask])),
            }
            for (_, rate), mask in _replay_masks(every)
        ]
    )


def composition_medians(schedule: pd.DataFrame, features: pd.DataFrame) -> np.ndarray:
    """Each step's model when nothing but its composition counts: the median time of the
    busy steps with the same composition (vLLM's counts), else of all steps with it."""
    from gpu_simulate_test.core.engines.step_record import COMPOSITION

    frame = schedule[list(COMPOSITION)].copy()
    frame["body"] = features["body_s"].to_numpy()
    frame["busy"] = features["busy"].to_numpy()
    keys = list(COMPOSITION)
    busy_med = frame[frame["busy"]].groupby(keys)["body"].median()
    all_med = frame.groupby(keys)["body"].median()
    index = pd.MultiIndex.from_frame(frame[keys])
    out = busy_med.reindex(index).to_numpy(dtype=float)
    return np.where(np.isfinite(out), out, all_med.reindex(index).to_numpy(dtype=float))
