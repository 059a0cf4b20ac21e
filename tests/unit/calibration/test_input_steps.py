"""The way in fitted through the engine's steps (calibration version 15): a request held for a
step in progress has its hop in a window; the window's middle overestimates it the longer the
steps, and the line fitted through the steps recovers the hop that put each request where the
engine queued it."""

from __future__ import annotations

import numpy as np
import pytest

from gpu_simulate_test.calibration import input_steps
from gpu_simulate_test.calibration.frontend import hop_s, input_line


def engine(step_ms: float, gap_ms: float, count: int = 400) -> np.ndarray:
    """Back-to-back steps of ``step_ms`` with ``gap_ms`` between them: (start, end) rows (s)."""
    ends = np.cumsum(np.full(count, step_ms + gap_ms)) / 1e3
    return np.c_[ends - step_ms / 1e3, ends]


def sends(spans: np.ndarray, hop_ms: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sends spread over the steps and when the engine queues each, ``hop_ms`` later."""
    rng = np.random.default_rng(seed)
    sent = np.sort(rng.uniform(spans[5, 0], spans[-5, 1], len(hop_ms)))
    return sent, input_steps.queued_at(sent + hop_ms / 1e3, spans)


def test_the_engine_queues_a_request_at_the_end_of_the_step_it_arrives_in() -> None:
    spans = np.array([[0.0, 0.010], [0.011, 0.020]])
    queued = input_steps.queued_at(np.array([0.002, 0.0105, 0.011, 0.0199, 0.025]), spans)
    assert queued.tolist() == [0.010, 0.0105, 0.020, 0.020, 0.025]  # a gap, an idle engine
    assert input_steps.queued_at(np.array([0.5]), np.zeros((0, 2))).tolist() == [0.5]


@pytest.mark.parametrize(("step_ms", "gap_ms"), [(7.0, 0.0), (10.0, 1.0), (20.0, 0.0)])
def test_the_steps_give_back_the_hop_the_windows_middle_overestimates(
    step_ms: float, gap_ms: float
) -> None:
    spans = engine(step_ms, gap_ms)
    hop = np.full(600, 3.0)
    sent, queued = sends(spans, hop, seed=int(step_ms))
    middles = [1e3 * hop_s(s, q, spans) for s, q in zip(sent, queued, strict=True)]
    assert np.mean(middles) > 3.4  # the middle of the window reads the hop long
    fitted = input_steps.fit_through_steps(sent, queued, np.ones(600), spans, (3.5, 0.0))
    assert fitted is not None and fitted.requests == 600
    assert fitted.input_ms + fitted.input_per_running_ms == pytest.approx(3.0, abs=0.15)
    assert fitted.mean_abs_error_ms < fitted.midpoint_mean_abs_error_ms


def test_a_line_in_the_requests_running_is_recovered_and_the_count_held_at_its_most() -> None:
    spans = engine(9.0, 0.5)
    rng = np.random.default_rng(1)
    running = rng.integers(1, 13, 800).astype(float)
    sent, queued = sends(spans, 2.0 + 0.25 * np.minimum(running, 8), seed=2)
    fitted = input_steps.fit_through_steps(sent, queued, running, spans, (4.0, 0.1), 8.0)
    assert fitted is not None
    assert fitted.input_ms == pytest.approx(2.0, abs=0.3)
    assert fitted.input_per_running_ms == pytest.approx(0.25, abs=0.04)
    assert (
        input_steps.fit_through_steps(sent[:19], queued[:19], running[:19], spans, (4, 0)) is None
    )


def test_the_calibration_keeps_the_middles_line_beside_the_one_through_the_steps() -> None:
    spans = engine(10.0, 1.0)
    rng = np.random.default_rng(4)
    running = np.concatenate([np.zeros(60, int), rng.integers(1, 10, 500)])
    busy = running > 0
    sent = np.sort(rng.uniform(spans[5, 0], spans[-5, 1], len(running)))
    queued = sent + 0.004  # idle sends: on arrival, 4 ms
    queued[busy] = input_steps.queued_at(sent[busy] + 0.0025, spans)
    hops = [1e3 * (q - s) if not b else 1e3 * hop_s(s, q, spans)
            for s, q, b in zip(sent, queued, busy, strict=True)]  # fmt: skip
    line = input_line(running.tolist(), hops, 3, idle=True)
    refit = input_steps.through_steps(line, sent.tolist(), queued.tolist(), running.tolist(), spans)
    assert refit["input_idle_ms"] == pytest.approx(4.0)  # the idle sends are exact: kept
    assert refit["input_midpoint"] == {
        "input_ms": line["input_ms"],
        "input_per_running_ms": line["input_per_running_ms"],
    }
    assert refit["input_ms"] + refit["input_per_running_ms"] * 5 == pytest.approx(2.5, abs=0.2)
    assert line["input_ms"] + line["input_per_running_ms"] * 5 > 3.0  # the middles read long
    assert refit["input_through_steps"]["requests"] == 500
    few = input_line([0] * 30 + [1, 2] * 5, [4.0] * 30 + [3.0] * 10, 3, idle=True)
    unchanged = input_steps.through_steps(few, [0.0] * 40, [0.0] * 40, [0] * 30 + [1, 2] * 5, spans)
    assert unchanged == few  # ten busy sends: nothing to fit
