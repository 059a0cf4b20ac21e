"""Step time under serving load (calibration/serving_load): the features of a vLLM step record,
the fitted terms recovering what is planted in them, the residual analysis finding the candidate
that matters, and the engine clock of a simulated request starting where vLLM's does."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.calibration import serving_load, serving_residuals, wake
from gpu_simulate_test.core.engines.step_record import FOREIGN, parse_requests
from gpu_simulate_test.simulator.run import run_v1
from gpu_simulate_test.simulator.types import ENGINE_QUEUED, V1Params
from tests.unit.simulator.test_vllm_v1 import Fixed

DATA = Path(__file__).resolve().parents[2] / "data" / "vllm" / "step_record"


def schedule() -> pd.DataFrame:
    return pd.read_csv(DATA / "engine_schedule.csv")


def test_features_of_a_real_step_record_count_every_request_once() -> None:
    steps = schedule()
    f = serving_load.step_features(steps)
    assert len(f) == len(steps) == 661
    ids = {rid for items in steps["requests"] for rid, _ in parse_requests(items)} - {FOREIGN}
    assert f["arrivals"].sum() == len(ids) == f["finishing"].sum()
    assert (f["body_s"] > 0).all() and (f["stream_rate"] >= 0).all()
    assert not f["busy"].iloc[0] and np.isnan(f["gap_s"].iloc[0])  # the run's first step woke it
    busy = f["busy"].to_numpy()
    assert np.isfinite(f["gap_s"][busy]).all() and (f["idle_ms"][busy] == 0).all()
    # a decode's KV after the step is the request's tokens so far
    first = steps["requests"].iloc[0].split()[0]
    assert f["chunks"].iloc[0][0] == (int(first.split(":")[1]),) * 2


def planted(n: int = 6000, seed: int = 0) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """Steps (2-8 ms predicted) replayed at three rates (10, 50, 100 requests/s taken in)
    stretched by 1.0, 1.1 and 1.4 with pauses of 0.05, 0.1 and 0.3 ms, and idle wake-ups
    costing 1 + 0.5 ms per decade of idle; with the rate each step was replayed at."""
    rng = np.random.default_rng(seed)
    group = rng.integers(0, 3, n)
    req = np.array([10.0, 50.0, 100.0])[group] * rng.normal(1, 0.05, n)
    stretch = np.array([1.0, 1.1, 1.4])[group]
    pause_ms = np.array([0.05, 0.1, 0.3])[group]
    busy = rng.random(n) > 0.1
    idle_ms = np.where(busy, 0.0, 10 ** rng.uniform(0, 3, n))
    pred = rng.uniform(0.002, 0.008, n)
    body = pred * stretch * rng.normal(1, 0.02, n)
    body = np.where(busy, body, pred + (1 + 0.5 * np.log10(np.maximum(idle_ms, 1))) / 1e3)
    frame = pd.DataFrame(
        {
            "body_s": body,
            "busy": busy,
            "gap_s": np.where(busy, pause_ms / 1e3, np.nan),
            "idle_ms": idle_ms,
            "arrival_rate": np.where(busy, req, 0.0),
            "stream_rate": np.where(busy, 10 * req, 0.0),
            "in_flight": rng.integers(1, 30, n),
            "waiting": np.zeros(n, dtype=int),
            "arrivals": rng.integers(0, 2, n),
            "finishing": rng.integers(0, 2, n),
        }
    )
    return frame, pred, group.astype(float)


def test_fit_recovers_planted_terms() -> None:
    frame, pred, group = planted()
    load = serving_load.fit(frame, pred, group)
    assert load.rate_points == pytest.approx((10, 50, 100), rel=0.01)
    assert load.stretch_points == pytest.approx((1.0, 1.1, 1.4), abs=0.01)
    assert load.gap_points_ms == pytest.approx((0.05, 0.1, 0.3), abs=1e-6)
    assert load.stretch(30.0) == pytest.approx(1.05, abs=0.01)  # between the rates
    assert load.stretch(500.0) == load.stretch(load.rate_points[-1])  # never extrapolated
    assert load.stretch(0.0) == load.stretch(load.rate_points[0])
    assert load.gap_s(75.0) == pytest.approx(0.2e-3, abs=1e-5)
    assert load.wake0_ms == pytest.approx(1.0, abs=0.05)
    assert load.wake_per_decade_ms == pytest.approx(0.5, abs=0.05)
    assert load.wake_s(1e6) == load.wake_s(load.max_idle_ms / 1e3)
    assert 0 < load.noise_sigma < 0.05  # the planted 2% spread, nothing carried over
    report = serving_residuals.report(load, frame, pred, {"seed": 7})
    assert report["calibrated_on"] == {"seed": 7}
    # the terms bring the modelled total to the measured one
    assert abs(report["total_time_ratio"]["with_serving_terms"] - 1) < 0.01
    assert report["total_time_ratio"]["composition_only"] < 0.9
    # steps without a prediction are left out of the figures, and counted
    gaps = pred.copy()
    gaps[:100] = np.nan
    partial = serving_residuals.report(load, frame, gaps)
    assert partial["steps_without_prediction"] == 100
    assert abs(partial["total_time_ratio"]["with_serving_terms"] - 1) < 0.01


def test_the_wake_up_follows_the_idle_bands_where_a_line_in_log_idle_cannot() -> None:
    """Planted as the main job's truths measured it: flat to 50 ms idle, +3.5 ms by 300 ms,
    flat after. The bands' medians give it within 0.3 ms at 10, 300 and 900 ms idle; the line
    through the same wake-ups misses 300 ms by more than 0.5 ms. With fewer than two bands
    measured, the line is kept."""
    frame, pred, group = planted()
    idle = frame["idle_ms"].to_numpy()
    woke = idle > 0

    def truth(ms: np.ndarray) -> np.ndarray:  # ms of wake-up beyond the prediction
        return 3.5 / (1 + np.exp(-(np.log10(np.maximum(ms, 1)) - 1.9) * 8))

    frame["body_s"] = np.where(woke, pred + truth(idle) / 1e3, frame["body_s"])
    load = serving_load.fit(frame, pred, group)
    assert len(load.wake_idle_ms) == len(wake.WAKE_BANDS_MS) - 1
    for ms in (10.0, 300.0, 900.0):
        assert load.wake_s(ms / 1e3) * 1e3 == pytest.approx(truth(np.array([ms]))[0], abs=0.3)
    line = dataclasses.replace(load, wake_idle_ms=(), wake_points_ms=())
    assert abs(line.wake_s(0.3) * 1e3 - truth(np.array([300.0]))[0]) > 0.5
    few = wake.curve(np.array([5.0, 6.0, 7.0, 300.0]), np.array([0.0, 0.0, 0, 3]))
    assert few == ((), ())  # one band with three: the line


def test_slow_moments_carry_over_as_calibrated() -> None:
    """Steps whose log time carries a slow AR(1) part (0.9 a step, half the variance): the
    fitted noise finds both, and the seeded factors it draws reproduce them with mean 1."""
    rng = np.random.default_rng(3)
    n = 20000
    slow = np.zeros(n)
    for k in range(1, n):
        slow[k] = 0.9 * slow[k - 1] + 0.1 * np.sqrt(1 - 0.81) * rng.normal()
    log = slow + 0.1 * rng.normal(size=n)
    pred = np.full(n, 0.004)
    frame, _, _ = planted(n=n)
    frame["body_s"] = pred * np.exp(log)
    frame["busy"] = True
    frame["gap_s"] = 0.0001
    load = serving_load.fit(frame, pred)
    assert load.noise_sigma == pytest.approx(np.std(log), rel=0.05)
    assert load.noise_phi == pytest.approx(0.9, abs=0.05)
    assert load.noise_slow_share == pytest.approx(0.5, abs=0.1)
    draws = np.log(np.array([x for _, x in zip(range(n), load.noise(seed=1), strict=False)]))
    assert np.mean(np.exp(draws)) == pytest.approx(1.0, abs=0.01)
    assert np.corrcoef(draws[:-4], draws[4:])[0, 1] == pytest.approx(0.5 * 0.9**4, abs=0.06)
    first = list(zip(range(5), load.noise(seed=1), strict=False))
    assert first == list(zip(range(5), load.noise(seed=1), strict=False))  # a seed repeats
    assert first != list(zip(range(5), load.noise(seed=2), strict=False))  # and decides


def test_residual_analysis_finds_the_candidate_that_matters() -> None:
    frame, pred, _ = planted()
    busy = frame["busy"].to_numpy()
    rows = {
        r["candidate"]: r
        for r in serving_residuals.residual_analysis(
            frame[busy], frame["body_s"][busy] / pred[busy]
        )
    }
    assert set(rows) == set(serving_load.CANDIDATES) == set(serving_load.AXIS_LABELS)
    assert rows["arrival_rate"]["spearman"] > 0.6
    assert rows["arrival_rate"]["mean_ratio_high"] > rows["arrival_rate"]["mean_ratio_low"] + 0.2
    for other in ("in_flight", "arrivals", "finishing"):
        assert abs(rows[other]["spearman"]) < 0.1
    assert rows["waiting"]["spearman"] is None  # never varies


def test_too_few_steps_fit_nothing() -> None:
    frame, pred, group = planted(n=10)
    load = serving_load.fit(frame, pred, group)
    assert load == serving_load.ServingLoad()
    assert load.stretch(50.0) == 1.0 and load.gap_s(50.0) == 0.0


def test_a_request_arriving_during_a_step_is_queued_when_it_ends() -> None:
    """vLLM's engine core reads new requests between steps: the second request, sent 2 ms into
    a 10 ms step, is queued at its end; the first, on an idle engine, when it arrived."""
    params = V1Params(max_num_batched_tokens=256, max_num_seqs=8, block_size=16, num_blocks=64)
    result = run_v1(
        params, Fixed(0.01), np.array([0.0, 0.002]), np.array([16, 16]), np.array([3, 3])
    )
    queued = result.requests[ENGINE_QUEUED].to_numpy()
    assert queued[0] == 0.0
    assert queued[1] == pytest.approx(0.01)
    assert math.isclose(result.schedule["start_time_s"].iloc[1], 0.01)


def test_calibration_replays_are_seeded_poisson_within_their_bounds(tmp_path: Path) -> None:
    from gpu_simulate_test.calibration import serving_replay
    from gpu_simulate_test.config.vidur import EngineCalibrationConfig

    cfg = EngineCalibrationConfig(
        decode_tokens=16, serving_rates=(0.1, 0.5), serving_duration_s=4, serving_rounds=1
    )
    assert serving_replay.capacity_qps({1: 4.0, 8: 8.0}, 10.0) == pytest.approx(100.0)
    assert serving_replay.capacity_qps({}, 10.0) is None
    replays = serving_replay.plan(cfg, 100.0, (16, 64), 1000, first_id=50)
    again = serving_replay.plan(cfg, 100.0, (16, 64), 1000, first_id=50)
    assert replays == again  # seeded by engine.serving_seed
    assert [r.rate_qps for r in replays] == [10.0, 50.0]
    assert [len(r.requests) for r in replays] == [40, 200]
    ids = [q.request_id for r in replays for q in r.requests]
    assert ids == list(range(50, 50 + 240))
    lo, hi = serving_replay.output_range(cfg)
    for replay in replays:
        arrivals = np.array([q.scheduled_arrival_s for q in replay.requests])
        assert arrivals[0] == 0.0 and (np.diff(arrivals) >= 0).all()
        assert np.mean(np.diff(arrivals)) == pytest.approx(1 / replay.rate_qps, rel=0.35)
        assert all(16 <= q.num_prefill_tokens <= 64 for q in replay.requests)
        assert all(lo <= q.num_decode_tokens <= hi for q in replay.requests)
    other = serving_replay.plan(
        EngineCalibrationConfig(serving_seed=1, serving_rates=(0.1,)), 100.0, (16, 64), 1000, 0
    )
    assert len(other) == 3  # three rounds by default, every rate once per round
    assert other[0].requests != replays[0].requests[: len(other[0].requests)]


def test_the_bundle_report_of_replays_names_each_rate_and_plots(tmp_path: Path) -> None:
    from gpu_simulate_test.calibration import serving_replay

    steps = schedule()
    cut = float(steps["end_time_s"].iloc[300])
    mid = float(steps["end_time_s"].iloc[150])
    end = float(steps["end_time_s"].iloc[-1])
    windows = [(5.0, 0.0, mid), (20.0, mid + 1e-9, cut), (5.0, cut + 1e-9, end)]
    table = serving_replay.serving_steps(steps, windows, "vllm")
    assert len(table) == len(steps) and set(table["backend"]) == {"vllm"}
    assert list(table["replay"].unique()) == [0, 1, 2]
    report = serving_replay.bundle_report(table, tmp_path / "residuals.png")
    assert [r["rate_qps"] for r in report["by_rate"]] == [5.0, 20.0]
    assert [r["replay"] for r in report["by_replay"]] == [0, 1, 2]
    assert sum(r["steps"] for r in report["by_rate"]) == len(steps)
    # the two rounds of 5 req/s: the drift is their spread, the same as replay_drift's
    a, c = report["by_replay"][0]["mean_ratio"], report["by_replay"][2]["mean_ratio"]
    assert report["drift"] == pytest.approx(abs(a - c) / ((a + c) / 2))
    assert serving_replay.replay_drift(table) == pytest.approx(report["drift"])
    assert serving_replay.drift([{"rate_qps": 1.0, "steps": 50, "mean_ratio": 1.0}]) == 0.0
    assert {r["candidate"] for r in report["residuals"]} == set(serving_load.CANDIDATES)
    assert (tmp_path / "residuals.png").stat().st_size > 10_000


def test_interp_is_numpys_bit_for_bit() -> None:
    """The clock's scalar interpolation returns exactly what ``np.interp`` returns: inside,
    outside, on the points, between equal values, over random tables."""
    from gpu_simulate_test.calibration.serving_load import interp

    rng = np.random.default_rng(3)
    for _ in range(200):
        n = int(rng.integers(1, 6))
        xp = tuple(float(x) for x in np.sort(rng.uniform(0.0, 50.0, n)))
        fp = tuple(float(y) for y in rng.choice([rng.normal(), 1.0, 0.0], n))
        xs = [*rng.uniform(-10.0, 60.0, 200), *xp, float("nan")]
        for x in xs:
            expected = float(np.interp(x, xp, fp))
            got = interp(float(x), xp, fp)
            assert got == expected or (np.isnan(got) and np.isnan(expected)), (x, xp, fp)


def test_the_pause_before_a_step_that_takes_a_request_in_is_fitted_apart() -> None:
    """A busy step that takes in a request pauses 1 ms before it, the others the planted
    pauses: the fit keeps both, one mean pause without them."""
    frame, pred, group = planted()
    taking = frame["busy"] & (frame["arrivals"] > 0)
    frame["gap_s"] = np.where(taking, 1e-3, frame["gap_s"])
    load = serving_load.fit(frame, pred, group)
    assert load.pauses_apart
    assert load.quiet_gap_points_ms == pytest.approx((0.05, 0.1, 0.3), abs=1e-6)
    assert load.intake_gap_ms == pytest.approx(1.0, abs=1e-6)
    assert load.gap_s(10.0) == pytest.approx(0.05e-3, rel=0.05)  # the quiet steps'
    # the mean pause over every busy step: about half take one in
    assert load.gap_points_ms[0] == pytest.approx(0.525, abs=0.05)
    one = load.without_intake_pause()
    assert not one.pauses_apart and one.gap_s(10.0) == pytest.approx(0.525e-3, abs=0.05e-3)
    # a record without its arrivals (or with too few taking one in) keeps one mean pause
    assert not serving_load.fit(frame.drop(columns="arrivals"), pred, group).pauses_apart


class Pausing(Fixed):
    """Steps of ``body`` seconds, 0.1 ms apart, 1 ms before a step that takes a request in."""

    def gap(self, index: int) -> float:
        return 1e-4

    def intake_gap(self, index: int) -> float:
        return 1e-3


class PausingStretches(Pausing):
    """:class:`Pausing` whose pure decode steps the engine takes in stretches."""

    def decode_body(self, index: int, start_s: float, requests: int, kv_tokens: int) -> float:
        return self.body_s


@pytest.mark.parametrize("clock", [Pausing, PausingStretches])
def test_a_busy_step_that_takes_a_request_in_pauses_apart(clock: type[Pausing]) -> None:
    """The second request reaches the engine 2 ms into the first's 10 ms prefill: it is
    scheduled 1 ms after the step's end, and queued then (vLLM's core takes its input in right
    before it schedules); the steps without one follow 0.1 ms apart, in a stretch of decodes
    too; without ``intake_gap`` every step 0.1 ms apart."""
    params = V1Params(max_num_batched_tokens=256, max_num_seqs=8, block_size=16, num_blocks=64)
    arrivals = np.array([0.0, 0.002, 0.0505])  # the third while the first two decode
    args = (arrivals, np.array([16, 16, 16]), np.array([8, 8, 3]))
    result = run_v1(params, clock(0.01), *args)
    queued = result.requests[ENGINE_QUEUED].to_numpy()
    start = result.schedule["start_time_s"].to_numpy()
    assert queued[1] == pytest.approx(0.011) and start[1] == pytest.approx(0.011)
    gaps = np.round((start[1:] - result.schedule["end_time_s"].to_numpy()[:-1]) * 1e3, 6)
    takes = result.schedule["num_prefill_requests"].to_numpy()[1:] > 0
    assert takes.sum() == 2 and set(gaps[takes]) == {1.0} and set(gaps[~takes]) == {0.1}

    class Even(clock):  # type: ignore[valid-type,misc]
        intake_gap = None

    even = run_v1(params, Even(0.01), *args).schedule
    assert even["start_time_s"].iloc[1] == pytest.approx(0.0101)


def test_the_knobs_set_the_fitted_terms_and_the_pause_apart_is_the_default() -> None:
    from gpu_simulate_test.config.vidur import VidurConfig
    from gpu_simulate_test.vidur_simulate.simulator import SimulationRequest
    from gpu_simulate_test.vidur_simulate.simulator_v1 import as_set

    frame, pred, group = planted()
    frame["gap_s"] = np.where(frame["busy"] & (frame["arrivals"] > 0), 1e-3, frame["gap_s"])
    load = dataclasses.replace(
        serving_load.fit(frame, pred, group), wake_residual_ms=(1.0,), busy_residual=((0.1,),)
    )
    kept = as_set(load, True, True, True)
    assert kept.pauses_apart and kept.gap_s(10.0) == pytest.approx(0.05e-3, rel=0.05)
    assert kept.wake_residual_ms == (1.0,) and kept.busy_residual == ((0.1,),)
    bare = as_set(load, False, False, False)
    assert not bare.pauses_apart and bare.wake_residual_ms == () and bare.busy_residual == ()
    assert bare.gap_s(10.0) == load.without_intake_pause().gap_s(10.0) > load.gap_s(10.0)
    assert VidurConfig().intake_pause is True
    fields = {f.name: f for f in dataclasses.fields(SimulationRequest)}
    assert fields["intake_pause"].default is True


def test_a_busy_step_that_takes_a_request_in_is_fitted_apart_and_the_stretch_without_it() -> None:
    """Planted: every busy step scheduling a request for the first time 0.5 ms longer than its
    rate's stretch. The fit keeps the 0.5 ms apart and the rates' stretch as planted; the
    report's modelled total still meets the measured one. Without ``intake_step`` nothing is
    apart and the stretch carries the planted extra."""
    frame, pred, group = planted()
    taking = frame["busy"].to_numpy() & (frame["arrivals"].to_numpy() > 0)
    frame["body_s"] = frame["body_s"] + np.where(taking, 0.5e-3, 0.0)
    load = serving_load.fit(frame, pred, group)
    assert load.intake_step_ms == pytest.approx(0.5, abs=0.02)
    assert load.stretch_points == pytest.approx((1.0, 1.1, 1.4), abs=0.01)
    report = serving_residuals.report(load, frame, pred)
    assert abs(report["total_time_ratio"]["with_serving_terms"] - 1) < 0.01
    modelled = serving_load.modelled_s(load, frame, pred)
    busy = frame["busy"].to_numpy()
    beyond = frame["body_s"].to_numpy() - modelled
    assert abs(beyond[taking].mean() - beyond[busy & ~taking].mean()) < 2e-5
    off = serving_load.fit(frame, pred, group, intake_step=False)
    assert off.intake_step_ms == 0.0
    assert all(o > p + 0.02 for o, p in zip(off.stretch_points, (1.0, 1.1, 1.4), strict=True))
    # nothing planted: nothing apart (the planted steps' 2% spread only)
    assert abs(serving_load.fit(*planted(seed=1)).intake_step_ms) < 0.02


def test_the_simulated_busy_step_that_takes_a_request_in_adds_its_extra() -> None:
    from gpu_simulate_test.simulator.step_model import BatchTimer, PredictorClock
    from gpu_simulate_test.simulator.types import Composition

    def base(shape: object, _: int) -> object:
        return type("T", (), {"total_time": 5e-3})()

    serving = serving_load.ServingLoad(
        rate_points=(1.0,), stretch_points=(1.0,), gap_points_ms=(0.1,), intake_step_ms=0.7
    )
    times = {}
    for first, idle in ((0, 0.0), (1, 0.0), (1, 0.5)):
        clock = PredictorClock(BatchTimer(base, granularity=16), serving, scale=2.0)
        step = Composition(1, 16, 0, 0, ((16, 16),), idle_s=idle, first_scheduled=first)
        times[first, idle] = clock.body(0, step)
    assert times[1, 0.0] - times[0, 0.0] == pytest.approx(1.4e-3)  # 0.7 ms at the level 2
    assert times[1, 0.5] == pytest.approx(2 * (5e-3 + serving.wake_s(0.5)))  # in its wake-up
