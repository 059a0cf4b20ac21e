"""The slow moments of a busy engine: the spread of its steps' log time around the serving
model (:class:`~.serving_load.ServingLoad`'s ``noise_sigma``), how long a slow moment lasts and
how much of the spread is slow (``noise_phi``, ``noise_slow_share``)."""

from __future__ import annotations

import numpy as np

NOISE_LAGS = (1, 4)
"""The step lags whose autocorrelations set the slow part's carry-over and share."""


def fit(
    body: np.ndarray, modelled: np.ndarray, busy: np.ndarray, min_pairs: int
) -> tuple[float, float, float]:
    """The spread ``sigma`` of the busy steps' log time (``body``) around their ``modelled``
    time (read at the ``busy`` steps only), and its slow part: with autocorrelations a1, a4 at
    lags 1 and 4 (over runs of consecutive busy steps), the slow part carries over
    ``phi = (a4 / a1) ** (1 / 3)`` a step and holds ``a1 / phi`` of the variance; (sigma, 0, 0)
    with fewer than ``min_pairs`` pairs at a lag."""
    index = np.flatnonzero(busy)
    resid = np.log(body[index] / modelled[index])
    sigma = float(np.std(resid))
    centred = np.zeros(len(body))
    centred[index] = resid - resid.mean()
    acs = []
    for lag in NOISE_LAGS:
        pairs = index[:-lag][np.all([busy[index[:-lag] + j] for j in range(1, lag + 1)], axis=0)]
        if len(pairs) < min_pairs or sigma == 0:
            return sigma, 0.0, 0.0
        acs.append(float(np.corrcoef(centred[pairs], centred[pairs + lag])[0, 1]))
    a1, a4 = max(acs[0], 0.0), max(acs[1], 0.0)
    phi = float(np.clip((a4 / a1) ** (1.0 / 3.0), 0.0, 0.99)) if a1 > 0 and a4 > 0 else 0.0
    share = float(np.clip(a1 / phi, 0.0, 1.0)) if phi > 0 else 0.0
    return sigma, phi, share
