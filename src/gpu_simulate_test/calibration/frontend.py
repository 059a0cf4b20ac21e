"""The serving front end around the engine, measured by the engine calibration (milliseconds).

A request reaches the engine's scheduler ``input_ms + input_per_running_ms · running`` after the
client sent it (``running``: requests in flight at the send) and each token reaches the client
``output_ms`` after the engine made it (:class:`gpu_simulate_test.calibration.overhead.FrontEnd`).

Two readings, one checking the other:

- :func:`frontend_from_engine_clock`, where the engine stamps every request itself (a vLLM server
  with the recording scheduler, :mod:`gpu_simulate_test.core.engines.step_record`): input is the
  engine's queue stamp less the client's send, output the client's first token less the engine's,
  for each prompt the iteration-log reading also takes (idle prefills, mixed newcomers), the
  hop to the engine separated from the wait for a step in progress. The line through them is a
  Theil-Sen fit (the median of the pairwise slopes, the median intercept): no single reading,
  and no single group of readings, decides it;
- :func:`frontend_latency`, from the engine's iteration log (each step's log line, read off the
  server's output, less its own time): what a server without stamps gives. A line read late (the
  API server busy, a first step after a pause) inflates the input it implies, the likely cause of
  an idle engine's input once read as 59 ms against 3 ms (issue 28).

The calibration keeps the first where there is one and records the second beside it with their
difference (``check``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from gpu_simulate_test.calibration import busy_hop, input_steps
from gpu_simulate_test.calibration.common import windows
from gpu_simulate_test.calibration.experiments import Experiment
from gpu_simulate_test.calibration.input_spread import (
    MIN_SPREAD_SAMPLES,
    SPREAD_BUCKETS,
    SPREAD_LEVELS,
    spread_bucket,
)
from gpu_simulate_test.calibration.overhead import running_max
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder
from gpu_simulate_test.core.engines.vllm_log import step_cost_ms

CHECK_TOLERANCE_MS = 2.0
"""The two readings of the front end's total agree when within this, or within
:data:`CHECK_TOLERANCE_FRACTION` of the stamped one."""
CHECK_TOLERANCE_FRACTION = 0.5


def _line(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """``(intercept, slope)`` of y over x by least squares, slope and intercept >= 0 (a flat
    line at the median with one x)."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(np.unique(xs)) < 2:
        return max(0.0, float(np.median(ys))), 0.0
    slope, intercept = np.polyfit(xs, ys, 1)
    if slope < 0:
        return max(0.0, float(np.median(ys))), 0.0
    if intercept < 0:  # through the origin instead
        return 0.0, max(0.0, float(np.dot(xs, ys) / np.dot(xs, xs)))
    return float(intercept), float(slope)


def frontend_latency(
    experiments: Sequence[Experiment],
    groups: Sequence[Sequence[BenchRequest]],
    recorder: Recorder,
    starts: Sequence[float],
    steps: pd.DataFrame,
) -> dict[str, Any] | None:
    """The front end's latency around a prompt's step, and how its input side grows with the
    requests the server is already streaming (ms).

    - Idle prefills (0 running): the **total** is what the client's TTFT has beyond the prompt's
      step at its full cost (what a simulated step costs); the **input** is from the client's
      send to the step's start (the log line's time less the step's own time), capped at the
      total; ``output_ms`` is the rest (the result's way back).
    - Mixed experiments' newcomers (B decoders running): the newcomer reached the engine after the
      previous step started (else that step would have taken it) and before its own step started;
      its input is taken as the middle of that window, from its send.

    The input medians per number of running requests are fitted with a non-negative line,
    ``input_ms + input_per_running_ms · running``: on 2 CPU cores the API server streams every
    running request's tokens on the cores the engine and the client use, and a newcomer waits
    behind them. None without idle prefill steps.
    """
    _, loop = step_cost_ms(steps)
    times = steps["time_s"].to_numpy(dtype=float)
    starts_at = times - steps["elapsed_ms"].to_numpy(dtype=float) / 1000.0
    inputs: dict[int, list[float]] = {}
    totals: list[float] = []
    for i, exp, rows in windows(experiments, starts, steps):
        if exp.phase in ("decode", "burst"):  # a burst's prompts queue behind one another
            continue
        running = exp.batch_size if exp.phase == "mixed" else 0
        rec = recorder.records[groups[i][-1].request_id]  # the prompt (a mixed one's newcomer)
        if not rows.size or rec.arrival_s is None or not rec.event_times_s:
            continue
        k = int(rows[0])
        sent, start = rec.arrival_s, float(starts_at[k])
        if running == 0:
            inputs.setdefault(0, []).append(1000.0 * (start - sent))
            elapsed = float(times[k]) - start
            totals.append(1000.0 * (rec.event_times_s[0] - sent - elapsed) - loop)
        elif k > 0:
            earliest = max(sent, float(starts_at[k - 1]))
            inputs.setdefault(running, []).append(1000.0 * ((earliest + start) / 2.0 - sent))
    if 0 not in inputs:
        return None
    total = max(0.0, float(np.median(totals)))
    medians = {n: float(np.median(v)) for n, v in sorted(inputs.items())}
    medians[0] = min(total, max(0.0, medians[0]))
    in_a, in_b = _line(list(medians), list(medians.values()))
    in_a = min(in_a, total)
    return {
        "input_ms": round(in_a, 4),
        "input_per_running_ms": round(in_b, 4),
        "output_ms": round(total - in_a, 4),
        "engine_loop_ms": round(loop, 4),
        "measured_input_ms": {str(n): round(v, 4) for n, v in medians.items()},
        "samples": {str(n): len(v) for n, v in inputs.items()},
    }


def theil_sen(
    x: Sequence[float] | np.ndarray, y: Sequence[float] | np.ndarray
) -> tuple[float, float]:
    """``(intercept, slope)``: the median of the pairwise slopes (pairs with different x), the
    median of ``y - slope · x``; both clamped at 0 (a flat line at the median with one x)."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    i, j = np.triu_indices(len(xs), k=1)
    apart = xs[j] != xs[i]
    if not apart.any():
        return max(0.0, float(np.median(ys))), 0.0
    slope = max(0.0, float(np.median((ys[j] - ys[i])[apart] / (xs[j] - xs[i])[apart])))
    return max(0.0, float(np.median(ys - slope * xs))), slope


def recorded_schedule(backend: Any, recorder: Recorder) -> pd.DataFrame | None:
    """A vLLM server's step record as the ``engine_schedule`` table on the recorder's clock
    (None without one)."""
    record = getattr(backend, "record", None)
    if record is None or not len(record.steps):
        return None
    table: pd.DataFrame = record.table(
        float(getattr(backend, "record_offset", 0.0)), recorder.origin
    )
    return table


HELD_BACK_S = 0.0005
"""A request the engine queued within this of a step's end arrived while that step ran: the
engine core takes new requests only between steps."""


def hop_s(sent: float, queued: float, steps: np.ndarray | None) -> float:
    """The front end's input hop of one request (seconds): from its send to when it reached the
    engine core. Queued on an idle engine, that is the queue stamp; queued right after a step
    ended, it arrived while the step ran (or after the send, whichever is later), taken as the
    middle of that window. ``steps``: (start, end) rows on the recorder's clock."""
    if steps is not None and len(steps):
        k = int(np.searchsorted(steps[:, 1], queued, side="right")) - 1  # the step ended before
        if k >= 0 and queued - steps[k, 1] <= HELD_BACK_S and steps[k, 1] > sent:
            lo = max(sent, float(steps[k, 0]))
            return (lo + float(steps[k, 1])) / 2.0 - sent
    return queued - sent


def frontend_from_engine_clock(
    experiments: Sequence[Experiment],
    groups: Sequence[Sequence[BenchRequest]],
    recorder: Recorder,
    steps: np.ndarray | None = None,
) -> dict[str, Any] | None:
    """The front end from the engine's own stamps of the calibration's prompts: each idle
    prefill's (no request running) and each mixed experiment's newcomer (its decoders running),
    as the iteration-log reading takes them, but exact: the input hop from the engine's queue
    stamp (:func:`hop_s`; the decode experiments' bursts of simultaneous sends queue behind one
    another in the API server, which serving at a rate does not), the output from the engine's
    first-token stamp to the client's. None: fewer than three prompts carry stamps."""
    running: list[int] = []
    inputs: list[float] = []
    outputs: list[float] = []
    for exp, group in zip(experiments, groups, strict=True):
        if exp.phase in ("decode", "burst"):  # a burst's prompts queue behind one another
            continue
        rec = recorder.records[group[-1].request_id]
        first = rec.engine_first_token
        if (
            rec.arrival_s is None
            or not rec.event_times_s
            or rec.engine_arrival_s is None
            or first is None
        ):
            continue
        running.append(exp.batch_size if exp.phase == "mixed" else 0)
        inputs.append(1000.0 * hop_s(rec.arrival_s, rec.engine_arrival_s, steps))
        outputs.append(1000.0 * (rec.event_times_s[0] - first))
    if len(inputs) < 3 or 0 not in running:
        return None
    line = input_line(running, inputs)
    return {
        "input_ms": line["input_ms"],
        "input_per_running_ms": line["input_per_running_ms"],
        "input_residual_ms": line["input_residual_ms"],
        "output_ms": round(max(0.0, float(np.median(outputs))), 4),
        "source": "engine stamps",
        "requests": len(inputs),
        "output_spread_ms": [round(float(v), 4) for v in np.percentile(outputs, [10, 90])],
        "measured_input_ms": line["measured_input_ms"],
        "samples": line["samples"],
    }


MIN_IDLE_SAMPLES = 10
"""Hops sent to an idle engine (no request in flight) needed for the idle way in to be kept
apart from the line (``input_idle_ms``)."""


def input_line(
    running: Sequence[int], hops_ms: Sequence[float], min_samples: int = 1, idle: bool = False
) -> dict[str, Any]:
    """The input hop's Theil-Sen line over the requests running at each send, the median hop
    per running count with at least ``min_samples`` readings (what the line went through, and
    how far the simulation follows it: ``running_max``), and the hops' spread around the line
    (``input_residual_ms``: per bucket of running requests, :data:`~.input_spread.SPREAD_BUCKETS`,
    with at least :data:`MIN_SPREAD_SAMPLES` hops, the residuals' quantiles at
    :data:`~.input_spread.SPREAD_LEVELS`).

    ``idle``: a send to an idle engine (none running) is its own reading, ``input_idle_ms``
    (their median, with at least :data:`MIN_IDLE_SAMPLES`), and the line is fitted on the
    others: an idle engine core waits blocked on its input and is woken by the request, a busy
    one takes it between steps (the wait for the step in progress is :func:`hop_s`'s, not the
    hop's). On four calibrations of this host the idle hop was 0.2 to 1.1 ms longer than with
    one to three requests running, where a line through both had it shorter. The line over
    every send is kept beside (``input_all_sends``)."""
    at = np.asarray(running, dtype=float)
    hops = np.asarray(hops_ms, dtype=float)
    at_idle = at == 0
    split = idle and np.sum(at_idle) >= MIN_IDLE_SAMPLES and len(np.unique(at[~at_idle])) >= 2
    in_a, in_b = theil_sen(at[~at_idle], hops[~at_idle]) if split else theil_sen(at, hops)
    model = in_a + in_b * at
    extra: dict[str, Any] = {}
    if split:
        idle_ms = max(0.0, float(np.median(hops[at_idle])))
        model = np.where(at_idle, idle_ms, model)
        all_a, all_b = theil_sen(at, hops)
        extra = {
            "input_idle_ms": round(idle_ms, 4),
            "input_idle_requests": int(np.sum(at_idle)),
            "input_all_sends": {
                "input_ms": round(all_a, 4),
                "input_per_running_ms": round(all_b, 4),
            },
        }
    residuals = hops - model
    bucket = spread_bucket(at)
    spread = {
        str(b): [round(float(v), 4) for v in np.quantile(residuals[bucket == b], SPREAD_LEVELS)]
        for b in SPREAD_BUCKETS
        if np.sum(bucket == b) >= MIN_SPREAD_SAMPLES
    }
    by_running: dict[int, list[float]] = {}
    for n, value in zip(running, hops_ms, strict=True):
        by_running.setdefault(n, []).append(value)
    kept = {n: v for n, v in sorted(by_running.items()) if len(v) >= min_samples}
    return {
        "input_ms": round(in_a, 4),
        "input_per_running_ms": round(in_b, 4),
        "measured_input_ms": {str(n): round(float(np.median(v)), 4) for n, v in kept.items()},
        "samples": {str(n): len(v) for n, v in kept.items()},
        "input_residual_ms": spread,
        **extra,
    }


def checked(stamped: dict[str, Any], logged: dict[str, Any] | None) -> dict[str, Any]:
    """``stamped`` with the log's reading beside it: the two totals at an idle engine and
    whether they agree (:data:`CHECK_TOLERANCE_MS`, :data:`CHECK_TOLERANCE_FRACTION`)."""
    total = stamped["input_ms"] + stamped["output_ms"]
    if logged is None:
        return {**stamped, "check": None}
    other = logged["input_ms"] + logged["output_ms"]
    gap = other - total
    agree = abs(gap) <= max(CHECK_TOLERANCE_MS, CHECK_TOLERANCE_FRACTION * total)
    return {
        **stamped,
        "check": {
            "engine_log": {k: logged[k] for k in ("input_ms", "input_per_running_ms", "output_ms")},
            "idle_total_ms": round(total, 4),
            "engine_log_idle_total_ms": round(other, 4),
            "difference_ms": round(gap, 4),
            "agree": bool(agree),
        },
    }


def sent_within(recorder: Recorder, start: float, end: float) -> list[Any]:
    """The recorded requests sent from ``start`` to ``end`` (a replay's window)."""
    return [
        r
        for r in recorder.records.values()
        if r.arrival_s is not None and start <= r.arrival_s <= end
    ]


def in_flight_at_sends(recs: Sequence[Any]) -> list[int]:
    """Per recorded request, how many of ``recs`` were in flight at its send: reached the engine
    before it, finished after it (-1 for one without a send or the engine's stamps)."""
    stamped = [
        (r.engine_arrival_s, r.engine_last_token)
        for r in recs
        if r.engine_arrival_s is not None and r.engine_last_token is not None
    ]
    reached = np.array([a for a, _ in stamped], dtype=float)
    done = np.array([d for _, d in stamped], dtype=float)
    return [
        int(np.sum((reached < r.arrival_s) & (done > r.arrival_s)))
        if r.arrival_s is not None
        and r.engine_arrival_s is not None
        and r.engine_last_token is not None
        else -1
        for r in recs
    ]


def queue_from_replays(
    recorder: Recorder,
    schedule: pd.DataFrame,
    windows: Sequence[tuple[float, float, float]],
) -> dict[str, Any] | None:
    """The front end as a queue (:mod:`gpu_simulate_test.calibration.frontend_queue`), fitted on the
    calibration replays under load: every request sent inside a replay's window, every step of
    the window (``schedule`` on the recorder's clock), each streamed token's delay from its step's
    end to the client. A stream chunk carrying several tokens counts once, at its last token;
    each stream's first chunk is marked, for its extra cost (``first_ms``), and the first chunk
    of a request sent to an idle engine for the way back's spread there
    (``first_idle_residual_ms``), to a busy one for its spread per bucket of requests in flight
    (``first_busy_residual_ms``). None without replays or with too few tokens."""
    from gpu_simulate_test.calibration import frontend_queue

    runs = []
    for _, start, end in windows:
        inside = schedule[(schedule["start_time_s"] >= start) & (schedule["end_time_s"] <= end)]
        recs = [r for r in sent_within(recorder, start, end) if r.engine_token_times_s]
        if inside.empty or not recs:
            continue
        prompts = {str(r.request_id): r.num_prefill_tokens for r in recs}
        made = frontend_queue.emitted(inside.reset_index(drop=True), prompts)
        engine: list[float] = []
        client: list[float] = []
        first: list[bool] = []  # the stream's first chunk
        idle: list[bool] = []  # ... of a request sent to an idle engine
        in_flight: list[int] = []  # requests in flight at its request's send
        for r, running in zip(recs, in_flight_at_sends(recs), strict=True):
            last = np.cumsum(r.event_num_tokens) - 1
            for n, (at, index) in enumerate(zip(r.event_times_s, last, strict=True)):
                if 0 <= index < len(r.engine_token_times_s):
                    engine.append(r.engine_token_times_s[int(index)])
                    client.append(at)
                    first.append(n == 0)
                    idle.append(n == 0 and running == 0)
                    in_flight.append(running)
        runs.append(
            frontend_queue.observed(
                [r.arrival_s for r in recs if r.arrival_s is not None],
                inside["end_time_s"].to_numpy(dtype=float),
                made.step_tokens,
                engine,
                client,
                first,
                token_idle=idle,
                token_running=in_flight,
            )
        )
    fitted = frontend_queue.fit(runs)
    if fitted is None:
        return None
    return {**fitted, "source": "calibration replays under load", "replays": len(runs)}


MIN_INPUT_SAMPLES = 3
"""A running count needs this many replayed requests to enter the input line's readings (and to
bound how far the simulation follows it: ``running_max``)."""
MIN_REPLAY_REQUESTS = 20
"""Fewer replayed requests with stamps than this: the input stays the experiments' reading."""


def input_from_replays(
    recorder: Recorder,
    schedule: pd.DataFrame,
    windows: Sequence[tuple[float, float, float]],
) -> dict[str, Any] | None:
    """The front end's input hop fitted on the calibration replays under load: every request
    sent inside a replay's window, its hop (:func:`hop_s`: send to the engine core, the wait for
    a step in progress left out) against the requests in flight at its send (reached the engine,
    not finished), a Theil-Sen line as :func:`frontend_from_engine_clock` fits, the sends to an
    idle engine apart (:func:`input_line`'s ``idle``), the line fitted again through the recorded
    steps (:func:`~.input_steps.through_steps`), and the busy sends' spread around it
    (:func:`~.busy_hop.busy_hop_spread`, each request's last token telling drains from arrivals).

    The replays send as the real bench does (an open loop at a rate, other requests streaming):
    on the main job's host an idle engine's hop read 5.0 ms there against 3.7 ms for the
    experiments' prompts, each sent on a quiet client (benchmarks/results/ttft_bias_20261127).
    None with fewer than :data:`MIN_REPLAY_REQUESTS` stamped requests."""
    spans = schedule[["start_time_s", "end_time_s"]].to_numpy(dtype=float)
    running: list[int] = []
    hops: list[float] = []
    sent: list[float] = []
    queued: list[float] = []
    done: list[float] = []
    for _, start, end in windows:
        recs = [
            r
            for r in sent_within(recorder, start, end)
            if r.engine_arrival_s is not None and r.engine_last_token is not None
        ]
        for r, n in zip(recs, in_flight_at_sends(recs), strict=True):
            assert r.arrival_s is not None and r.engine_arrival_s is not None
            running.append(n)
            hops.append(1000.0 * hop_s(r.arrival_s, r.engine_arrival_s, spans))
            sent.append(r.arrival_s)
            queued.append(r.engine_arrival_s)
            done.append(r.engine_last_token)
    if len(hops) < MIN_REPLAY_REQUESTS:
        return None
    line = input_line(running, hops, MIN_INPUT_SAMPLES, idle=True)
    fitted = input_steps.through_steps(line, sent, queued, running, spans)
    top = running_max(fitted.get("measured_input_ms"))
    spread = busy_hop.busy_hop_spread(sent, queued, running, spans, fitted, HELD_BACK_S, top, done)
    return {**fitted, **spread, "requests": len(hops)}


def with_replay_input(frontend: dict[str, Any], replayed: dict[str, Any] | None) -> dict[str, Any]:
    """``frontend`` (the experiments' reading) with its input line taken from the replays under
    load where they give one; the experiments' line is kept beside (``experiments_input``)."""
    if replayed is None:
        return frontend
    kept = {k: frontend.get(k) for k in INPUT_KEYS}
    return {
        **frontend,
        **{k: replayed[k] for k in INPUT_KEYS},
        **{k: replayed[k] for k in REPLAY_KEYS if k in replayed},
        "input_source": "calibration replays under load",
        "input_requests": replayed["requests"],
        "experiments_input": kept,
    }


INPUT_KEYS: tuple[str, ...] = (
    "input_ms",
    "input_per_running_ms",
    "measured_input_ms",
    "samples",
    "input_residual_ms",
)
"""What of the front end's reading is its input line."""
REPLAY_KEYS: tuple[str, ...] = (
    "input_idle_ms",
    "input_idle_requests",
    "input_all_sends",
    "input_midpoint",
    "input_through_steps",
    busy_hop.KEY,
    busy_hop.COUNT_KEY,
)
"""What the replays add beside the line, where they give it: the idle way in apart (version 14
on), the line fitted through the steps (15 on), the busy sends' spread around it (19 on)."""


def measured(
    experiments: Sequence[Experiment],
    groups: Sequence[Sequence[BenchRequest]],
    recorder: Recorder,
    starts: Sequence[float],
    logged: pd.DataFrame,
    recorded: pd.DataFrame | None,
    replays: tuple[pd.DataFrame, Sequence[tuple[float, float, float]]] | None,
) -> dict[str, Any] | None:
    """The front end a calibration records: the iteration log's reading
    (:func:`frontend_latency`, from the experiments' ``logged`` steps), replaced by the engine's
    stamps where there are some (:func:`frontend_from_engine_clock`, the log's reading kept as
    its check; ``recorded``: the experiments' recorded schedule, None without one), with the
    queue fitted on the replays under load (``replays``: the whole recorded schedule and the
    replays' windows; None without them) and, where the engine stamps requests, the input line
    too (:func:`input_from_replays`): the replays send as the judged runs do."""
    frontend = frontend_latency(experiments, groups, recorder, starts, logged)
    spans = None
    if recorded is not None:
        spans = recorded[["start_time_s", "end_time_s"]].to_numpy(dtype=float)
    stamped = frontend_from_engine_clock(experiments, groups, recorder, spans)  # exact
    if stamped is not None:
        frontend = checked(stamped, frontend)
    if frontend is not None and replays is not None:
        frontend["queue"] = queue_from_replays(recorder, *replays)
        if stamped is not None:  # the replays' requests carry the engine's stamps too
            frontend = with_replay_input(frontend, input_from_replays(recorder, *replays))
    return frontend
