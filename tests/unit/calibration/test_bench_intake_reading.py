"""``bench_intake_reading``: the sends' intake read as the serving fit reads it, then again and
again against the rates' stretch refitted without the last reading, until it settles."""

from __future__ import annotations

import numpy as np
import pytest
from benchmarks.calibration.bench_intake_reading import ROUNDS, readings, settled

from gpu_simulate_test.calibration import intake_phase, serving_load
from tests.unit.calibration.test_intake_phase import phased
from tests.unit.calibration.test_serving_load import planted


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
    frame, pred, group = planted(seed=1)
    rng = np.random.default_rng(8)
    sends = np.where(
        pred > np.median(pred), rng.poisson(np.array([0.4, 1.0, 1.6])[group.astype(int)]), 0
    )
    length_ms = frame["body_s"].to_numpy() * 1e3
    cells, added = [], np.zeros(len(frame))
    for k, n in enumerate(sends):
        offsets = np.sort(rng.uniform(0.0, length_ms[k], n))
        added[k] = 1.5 * float(np.sum(offsets >= 3.0))
        cells.append(intake_phase.format_offsets(offsets))
    frame = frame.assign(client_sends=sends, body_s=frame["body_s"] + added / 1e3)
    frame[intake_phase.CLIENT_SEND_OFFSETS] = cells
    seq = readings(frame, pred, group)
    assert seq[0][0] < 1.45  # one reading: low (1.36)
    assert seq[-1][0] == pytest.approx(1.5, abs=0.05)  # settled (1.53)
    assert seq[-1][1] == pytest.approx(3.0, abs=0.5)
