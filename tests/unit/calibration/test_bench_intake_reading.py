"""``bench_intake_reading``: the sends' intake read as the serving fit reads it, then again and
again against the rates' stretch refitted without the last reading, until it settles."""

from __future__ import annotations

import pytest
from benchmarks.calibration.bench_intake_reading import ROUNDS, readings, settled

from gpu_simulate_test.calibration import serving_load
from tests.unit.calibration.test_intake_phase import phased


def test_the_first_reading_is_the_fits() -> None:
    frame, pred, group = phased(free_ms=3.0)
    load = serving_load.fit(frame, pred, group)
    seq = readings(frame, pred, group)
    assert seq[0][0] == pytest.approx(load.intake_ms, abs=1e-9)
    assert seq[0][1] == load.intake_free_ms
    assert 1 < len(seq) < ROUNDS and settled(seq)
    assert not settled(seq[:1]) and not settled([(1.0, 0.0), (1.0, 0.25)])
    # one rate for every step: the fit's own labels matter (each rate's stretch cancels in it)
    assert readings(frame, pred, group * 0)[0][0] != pytest.approx(load.intake_ms, abs=1e-3)


def test_sends_only_in_long_steps_read_low_once_and_settle_at_the_planted_intake() -> None:
    """Sends falling only in the steps predicted longer than the median: the stretch fitted with
    their intake in carries part of it back onto those steps, so one reading is low; read
    against the stretch without it, the reading settles at the planted 1.5 ms."""
    frame, pred, group = phased(free_ms=3.0, seed=1, means=(0.4, 1.0, 1.6), long_only=True)
    seq = readings(frame, pred, group)
    assert seq[0][0] < 1.45  # one reading: low (1.36)
    assert seq[-1][0] == pytest.approx(1.5, abs=0.05)  # settled (1.53)
    assert seq[-1][1] == pytest.approx(3.0, abs=0.5)
