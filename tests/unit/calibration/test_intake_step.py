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


def test_the_term_is_read_without_the_part_the_stretch_carries_back() -> None:
    """Read against a stretch fitted with it, the term is low by the part the stretch carries
    back (half the steps take one in, predicted 10 ms longer than the others, over a mean
    prediction of 15 ms: a third); read again without that first reading, still 11% low; the
    fit gives the term itself, and a term below zero alike."""
    body, pred, busy, taking = planted(0.5)
    modelled = stretched_by(pred, busy)
    once = intake_step.extra_ms(body, modelled(body), busy, taking)
    assert once == pytest.approx(0.5 * (1 - 1 / 3), rel=1e-6)
    twice = intake_step.extra_ms(body, modelled(body - once / 1e3 * taking), busy, taking)
    assert twice == pytest.approx(0.5 * (1 - 1 / 9), rel=1e-6)
    assert intake_step.fit(body, modelled, busy, taking) == pytest.approx(0.5, abs=1e-6)
    below = planted(-0.3)[0]
    assert intake_step.fit(below, modelled, busy, taking) == pytest.approx(-0.3, abs=1e-6)
    # nothing planted: nothing read; too few steps taking one in: nothing read
    bare = planted(0.0)[0]
    assert abs(intake_step.fit(bare, modelled, busy, taking)) < 1e-9
    few = taking & (np.arange(len(body)) < 8)  # four
    assert intake_step.fit(body, modelled, busy, few) == 0.0


def test_the_term_is_found_where_reading_again_would_run_away() -> None:
    """Nine steps in ten take a request in, each predicted 1 ms against the others' 100: the
    stretch carries back −8.2 times the term, so reading again against the stretch without the
    last reading swings further each time; the fit still gives the planted 0.4 ms."""
    n = 300
    taking = np.arange(n) % 10 != 0
    pred = np.where(taking, 0.001, 0.100)
    body = 1.3 * pred + taking * 0.4e-3
    busy = np.ones(n, dtype=bool)
    modelled = stretched_by(pred, busy)
    once = intake_step.extra_ms(body, modelled(body), busy, taking)
    twice = intake_step.extra_ms(body, modelled(body - once / 1e3 * taking), busy, taking)
    assert abs(twice - 0.4) > abs(once - 0.4) > 1.0  # each reading further off
    assert intake_step.fit(body, modelled, busy, taking) == pytest.approx(0.4, abs=1e-6)
