"""The step that takes a request in: its extra read apart from the rates' stretch."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from gpu_simulate_test.calibration import intake_step


def planted(term_ms: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Busy steps at one rate, stretched 1.3×; every other takes a request in, predicted 20 ms
    where the others are predicted 10 ms, and lasts ``term_ms`` longer."""
    n = 300
    taking = np.arange(n) % 2 == 0
    pred = np.where(taking, 0.020, 0.010)
    body = 1.3 * pred + taking * term_ms / 1e3
    return body, pred, np.ones(n, dtype=bool), taking


def stretched_by(pred: np.ndarray, busy: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The modelled steps with one stretch fitted on the steps given: their total over the
    predictions' (the serving fit's ratio of totals)."""

    def modelled(body: np.ndarray) -> np.ndarray:
        return pred * (body[busy].sum() / pred[busy].sum())

    return modelled


def test_the_term_is_read_until_the_stretch_no_longer_carries_it() -> None:
    """Read once, the term is low by the taking steps' share of the stretch (their longer
    predictions carry more of it: a third here; twice, still 11% low); read until it settles,
    within 0.4%."""
    body, pred, busy, taking = planted(0.5)
    once = intake_step.extra_ms(body, stretched_by(pred, busy)(body), busy, taking)
    assert once == pytest.approx(0.5 * (1 - 0.5 * 10 / 15), rel=0.01)
    assert intake_step.fit(body, stretched_by(pred, busy), busy, taking) == pytest.approx(
        0.5, abs=0.002
    )
    # nothing planted: nothing read; too few steps taking one in: nothing read
    bare = planted(0.0)[0]
    assert abs(intake_step.fit(bare, stretched_by(pred, busy), busy, taking)) < 1e-9
    few = taking & (np.arange(len(body)) < 8)  # four
    assert intake_step.fit(body, stretched_by(pred, busy), busy, few) == 0.0
