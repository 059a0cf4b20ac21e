"""The front end as a queue (calibration/frontend_queue): its arithmetic by hand, its fit on real
vLLM runs (tests/data/vllm/frontend_queue: engine stamps and client times of the same tokens)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.calibration import frontend_queue as fq

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm" / "frontend_queue"


def _run(name: str) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    return (
        pd.read_csv(DATA / name / "request_metrics.csv"),
        pd.read_csv(DATA / name / "token_metrics.csv"),
        pd.read_csv(DATA / name / "engine_schedule.csv"),
    )


def _prompts(requests: pd.DataFrame) -> dict[str, int]:
    ids, lengths = requests.request_id.tolist(), requests.num_prefill_tokens.tolist()
    return {str(r): int(p) for r, p in zip(ids, lengths, strict=True)}


def _observed(name: str, quiet: int = 0) -> fq.Observed:
    """A real run's tokens; marked as sent to an idle engine: the first tokens of requests sent
    with at most ``quiet`` others in flight."""
    requests, tokens, schedule = _run(name)
    prompts = _prompts(requests)
    made = fq.emitted(schedule, prompts)
    sent = requests.arrival_time_s.to_numpy()
    reached = requests.engine_arrival_time_s.to_numpy()
    done = requests.engine_last_token_time_s.to_numpy()
    idle = {  # in flight at its send: reached the engine before it, finished after
        str(r): np.sum((reached < t) & (done > t)) <= quiet
        for r, t in zip(requests.request_id, sent, strict=True)
    }
    running = {
        str(r): int(np.sum((reached < t) & (done > t)))
        for r, t in zip(requests.request_id, sent, strict=True)
    }
    first = (tokens.token_index == 0).to_numpy()
    return fq.observed(
        sent.tolist(),
        schedule.end_time_s.to_numpy(),
        made.step_tokens,
        tokens.engine_time_s.tolist(),
        tokens.time_s.tolist(),
        first.tolist(),
        token_idle=(first & tokens.request_id.astype(str).map(idle).to_numpy(bool)).tolist(),
        token_running=tokens.request_id.astype(str).map(running).tolist(),
    )


def test_one_server_first_in_first_out() -> None:
    queue = fq.FrontEndQueue(request_ms=4.0, step_ms=1.0, token_ms=2.0)
    # a send at 0 (busy to 4 ms), a step ending at 1 ms with 3 tokens (waits: 4..11 ms), a step
    # ending at 5 ms with 1 token (waits for the first: 11..14 ms), an empty step
    delays = queue.delivery_delays_s(
        np.array([0.0]), np.array([0.001, 0.005, 0.020]), np.array([3, 1, 0])
    )
    expected = [
        (4.0 - 1.0) + 1.0 + 2.0 * (3 + 1) / 2,  # waited 3 ms, then step_ms and half its tokens
        (11.0 - 5.0) + 1.0 + 2.0 * (1 + 1) / 2,
        0.0,
    ]
    assert delays * 1e3 == pytest.approx(expected)
    # idle: only its own work, whatever the order the steps are given in
    alone = queue.delivery_delays_s(np.array([]), np.array([0.5, 0.1]), np.array([1, 1]))
    assert alone * 1e3 == pytest.approx([3.0, 3.0])


def test_emitted_tokens_match_the_engines_stamps() -> None:
    requests, tokens, schedule = _run("q50")
    prompts = _prompts(requests)
    made = fq.emitted(schedule, prompts)
    stamped = tokens.groupby("engine_time_s").size()
    at = np.searchsorted(schedule.end_time_s.to_numpy(), stamped.index.to_numpy())
    assert (made.step_tokens[at] == stamped.to_numpy()).all()
    assert made.step_tokens.sum() == len(tokens)  # and no step made tokens unstamped
    first = dict(
        zip(requests.request_id.astype(str), requests.engine_first_token_time_s, strict=True)
    )
    ends = schedule.end_time_s.to_numpy()
    for rid, k in made.first_step.items():
        assert ends[k] == pytest.approx(first[rid], abs=1e-9)


def test_fit_over_two_loads_follows_each() -> None:
    """Fitted over 20 and 50 req/s together, the queue puts each load's median token delay
    within 20% of the measured (6.4 and 11.0 ms); one constant, the best on the same tokens,
    misses one of them by more than 30%."""
    runs = [_observed("q20"), _observed("q50")]
    fitted = fq.fit(runs)
    assert fitted is not None and fitted["tokens"] == sum(len(r.delay_s) for r in runs)
    assert fitted["mean_abs_error_ms"] < fitted["constant_mean_abs_error_ms"]
    queue = fq.FrontEndQueue.from_calibration(fitted, "test")
    constant_misses = []
    for run in runs:
        predicted = queue.delivery_delays_s(run.sends_s, run.step_end_s, run.step_tokens)
        real = float(np.median(run.delay_s))
        assert float(np.median(predicted[run.token_step])) == pytest.approx(real, rel=0.2)
        constant_misses.append(abs(fitted["constant_ms"] / 1e3 / real - 1))
    assert max(constant_misses) > 0.3


def test_request_delays_follow_the_schedule() -> None:
    queue = fq.FrontEndQueue(request_ms=0.0, step_ms=1.0, token_ms=1.0)
    schedule = pd.DataFrame(
        {
            "start_time_s": [0.000, 0.010, 0.020],
            "end_time_s": [0.005, 0.015, 0.025],
            "requests": ["0:8 1:4", "0:1 1:4", "1:1"],
        }
    )
    first, last = fq.request_delays_s(queue, schedule, np.array([8, 8]), np.array([0.0, 0.0]))
    # request 0: first token in step 0 (one token there), last in step 1 (two tokens)
    # request 1: its prompt is done in step 1, its last token in step 2 (one token)
    assert first * 1e3 == pytest.approx([2.0, 2.5])
    assert last * 1e3 == pytest.approx([2.5, 2.0])


def test_a_first_token_pays_its_stream_s_first_chunk_on_real_runs() -> None:
    """On the real vLLM runs, the three costs put a request's first token 1.0 ms (20 req/s) and
    3.2 ms (50 req/s) earlier than it came, its later tokens within 0.4 ms: ``first_ms``, read
    off the first tokens once the three are fitted, closes that and lowers the error."""
    runs = [_observed("q20"), _observed("q50")]
    fitted = fq.fit(runs)
    blind = fq.fit([dataclasses.replace(r, first=np.zeros_like(r.first)) for r in runs])
    assert fitted is not None and blind is not None and blind["first_ms"] == 0.0
    assert fitted["first_tokens"] == 240 and fitted["first_ms"] > 1.0
    assert fitted["mean_abs_error_ms"] < blind["mean_abs_error_ms"]
    queue = fq.FrontEndQueue.from_calibration(fitted, "test")
    errors = np.concatenate(
        [
            queue.delivery_delays_s(r.sends_s, r.step_end_s, r.step_tokens)[r.token_step]
            + np.where(r.first, queue.first_ms / 1e3, 0.0)
            - r.delay_s
            for r in runs
        ]
    )
    first = np.concatenate([r.first for r in runs])
    assert abs(float(np.median(errors[first]))) < 1e-6  # the median first token, to the bit
    # a calibration before version 13 has none
    old = {k: fitted[k] for k in fq.KEYS}
    assert fq.FrontEndQueue.from_calibration(old, "test").first_ms == 0.0


def test_the_first_chunk_delays_a_first_token_and_a_last_that_is_its_first() -> None:
    queue = fq.FrontEndQueue(request_ms=0.0, step_ms=1.0, token_ms=1.0, first_ms=3.0)
    schedule = pd.DataFrame(
        {
            "start_time_s": [0.000, 0.010, 0.020],
            "end_time_s": [0.005, 0.015, 0.025],
            "requests": ["0:8 1:4", "0:1 1:4", "2:8"],
        }
    )
    prompts, sends = np.array([8, 8, 8]), np.zeros(3)
    first, last = fq.request_delays_s(queue, schedule, prompts, sends)
    # request 0: first token in step 0 (alone), last in step 1 (two tokens): only the first
    # pays the chunk; requests 1 (step 1) and 2 (step 2, alone) make one token each, their
    # first and their last: both pay it
    assert first * 1e3 == pytest.approx([2.0 + 3.0, 2.5 + 3.0, 2.0 + 3.0])
    assert last * 1e3 == pytest.approx([2.5, 2.5 + 3.0, 2.0 + 3.0])


@pytest.mark.parametrize(
    ("recorded", "message"),
    [
        ([1, 2], "expected a mapping"),
        ({"request_ms": 1.0, "step_ms": 1.0}, "token_ms: expected a number"),
        ({"request_ms": -1.0, "step_ms": 1.0, "token_ms": 0.1}, "request_ms: expected a finite"),
        ({"request_ms": True, "step_ms": 1.0, "token_ms": 0.1}, "request_ms: expected a number"),
    ],
)
def test_bad_calibration_names_the_key(recorded: object, message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        fq.FrontEndQueue.from_calibration(recorded, "meta.json: frontend.queue")
    assert "meta.json: frontend.queue" in str(err.value)


def test_too_few_tokens_fit_nothing() -> None:
    low = _observed("q20")
    few = fq.Observed(
        low.sends_s,
        low.step_end_s,
        low.step_tokens,
        low.token_step[:10],
        low.delay_s[:10],
        low.first[:10],
    )
    assert fq.fit([few]) is None


def test_a_send_waits_behind_the_stream_work_and_the_input_before_it() -> None:
    queue = fq.FrontEndQueue(request_ms=4.0, step_ms=1.0, token_ms=2.0)
    # a step ending at 1 ms with 3 tokens keeps the server busy 1..8 ms; a send at 2 ms waits
    # 6 ms, its input takes it to 12 ms; a send at 5 ms waits 7 ms; a send at 30 ms, none; the
    # step ending at 31 ms is after the last send; a NaN send (a closed loop's) has no wait
    waits = queue.input_waits_s(
        np.array([0.005, 0.002, np.nan, 0.030]),
        np.array([0.031, 0.001]),
        np.array([1, 3]),
    )
    assert waits[[1, 0, 3]] * 1e3 == pytest.approx([6.0, 7.0, 0.0])
    assert np.isnan(waits[2])
    # a step with no tokens makes no stream work
    idle = queue.input_waits_s(np.array([0.002]), np.array([0.001]), np.array([0]))
    assert idle.tolist() == [0.0]


def test_input_waits_read_a_schedule_as_the_way_back_does() -> None:
    requests, _, schedule = _run(sorted(p.name for p in DATA.iterdir() if p.is_dir())[0])
    queue = fq.FrontEndQueue(request_ms=2.0, step_ms=1.0, token_ms=0.3)
    ids = requests.request_id.to_numpy()
    schedule = schedule.assign(requests=schedule.requests.map(
        lambda text: " ".join(
            f"{np.flatnonzero(ids == int(rid))[0]}:{n}" if rid.isdigit() else f"{rid}:{n}"
            for rid, n in (item.split(":") for item in str(text).split())
        )
    ))  # fmt: skip
    prompts = requests.num_prefill_tokens.to_numpy()
    sends = requests.arrival_time_s.to_numpy()
    waits = fq.input_waits_s(queue, schedule, prompts, sends)
    made = fq.emitted(schedule, {str(i): int(p) for i, p in enumerate(prompts)})
    direct = queue.input_waits_s(sends, schedule.end_time_s.to_numpy(), made.step_tokens)
    assert waits == pytest.approx(direct)
    assert (waits >= 0).all() and waits.max() > 0  # some sends found the server busy


def test_an_idle_engines_first_tokens_keep_their_spread_around_the_queue() -> None:
    """The marked first tokens (the calibration marks those of requests sent to an idle
    engine; these real runs at 20 and 50 req/s have 3 such sends, so here: with at most four in
    flight): their measured delay less the queue's, kept as quantiles for the simulation to draw
    from (calibration version 16); read back, and a bad record refused by name."""
    three = fq.fit([_observed("q20"), _observed("q50")])
    assert three is not None and fq.IDLE_SPREAD_KEY not in three  # 3 idle sends: too few
    runs = [_observed("q20", quiet=4), _observed("q50", quiet=4)]
    fitted = fq.fit(runs)
    assert fitted is not None
    idle = np.concatenate([r.idle for r in runs if r.idle is not None])
    assert fitted["first_idle_tokens"] == int(np.count_nonzero(idle)) >= 20
    spread = fitted[fq.IDLE_SPREAD_KEY]
    assert len(spread) == 21 and spread == sorted(spread)
    queue = fq.FrontEndQueue.from_calibration(fitted, "test")
    measured = np.concatenate(
        [
            r.delay_s
            - queue.delivery_delays_s(r.sends_s, r.step_end_s, r.step_tokens)[r.token_step]
            - queue.first_ms / 1e3
            for r in runs
        ]
    )[idle]
    assert 1e3 * float(np.median(measured)) == pytest.approx(spread[10], abs=1e-3)
    assert spread[-1] - spread[10] > 0.2  # the slow first tokens, above the queue's
    assert queue.first_idle_residual_ms == tuple(spread)
    assert queue.to_dict()[fq.IDLE_SPREAD_KEY] == spread
    blind = fq.fit([dataclasses.replace(r, idle=None) for r in runs])
    assert blind is not None and fq.IDLE_SPREAD_KEY not in blind  # none marked: none kept
    for bad, message in (([1.0] * 20, "21 finite"), (spread[::-1], "increasing")):
        with pytest.raises(ValueError, match=rf"q\.first_idle_residual_ms: expected .*{message}"):
            fq.FrontEndQueue.from_calibration({**fitted, fq.IDLE_SPREAD_KEY: bad}, "q")


def test_a_busy_engines_first_tokens_keep_their_spread_per_requests_in_flight() -> None:
    """The first tokens of requests sent with others in flight (the two real runs at 20 and 50
    req/s): their measured delay less the queue's, kept per bucket of requests in flight as
    quantiles (calibration version 18); the busier buckets spread wider; read back, round
    tripped, and a bad record refused by name and bucket."""
    from gpu_simulate_test.calibration.input_spread import spread_bucket

    runs = [_observed("q20"), _observed("q50")]
    fitted = fq.fit(runs)
    assert fitted is not None
    busy = fitted[fq.BUSY_SPREAD_KEY]
    first = np.concatenate([r.first for r in runs])
    running = np.concatenate([r.running for r in runs if r.running is not None])
    assert fitted["first_busy_tokens"] == int(np.count_nonzero(first & (running > 0)))
    kept = {str(b) for b in spread_bucket(running[first & (running > 0)])}
    assert set(busy) <= kept and len(busy) >= 2 and "0" not in busy
    queue = fq.FrontEndQueue.from_calibration(fitted, "q")
    assert [k for k, _ in queue.first_busy_residual_ms] == sorted(int(k) for k in busy)
    for key, spread in busy.items():
        assert len(spread) == 21 and spread == sorted(spread)
        modelled = np.concatenate(
            [
                r.delay_s
                - queue.delivery_delays_s(r.sends_s, r.step_end_s, r.step_tokens)[r.token_step]
                - queue.first_ms / 1e3
                for r in runs
            ]
        )
        mine = first & (running > 0) & (spread_bucket(running) == int(key))
        assert 1e3 * float(np.median(modelled[mine])) == pytest.approx(spread[10], abs=1e-3)
    widths = [v[-2] - v[1] for _, v in queue.first_busy_residual_ms]
    assert widths[-1] > widths[0]  # the busier, the wider
    assert queue.to_dict()[fq.BUSY_SPREAD_KEY] == busy
    blind = fq.fit([dataclasses.replace(r, running=None) for r in runs])
    assert blind is not None and fq.BUSY_SPREAD_KEY not in blind  # not recorded: none kept
    one = next(iter(busy))
    for bad, message in (
        ({one: [1.0] * 20}, rf"q\.first_busy_residual_ms\.{one}: expected .*21 finite"),
        ({"x": busy[one]}, r"q\.first_busy_residual_ms\.x: expected a running count"),
        ([1.0], r"q\.first_busy_residual_ms: expected a mapping"),
    ):
        with pytest.raises(ValueError, match=message):
            fq.FrontEndQueue.from_calibration({**fitted, fq.BUSY_SPREAD_KEY: bad}, "q")
