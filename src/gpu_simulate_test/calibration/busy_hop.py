"""The way in of a request sent to a busy engine, its spread fitted through the steps
(calibration version 19, issue 64; its drains read as drains, version 20).

A request sent while the engine steps reaches the engine core's input after its hop (the API
server's intake), and the engine takes it in only between steps. Its hop is therefore seen only
as a window: a request queued at a step's end arrived while that step ran, so its hop lies
between the step's start (or its send) and its end; one queued between steps on an idle engine
arrived then, its hop exact. An engine with work never waits for input (vLLM's busy loop drains
its input queue between steps and steps again), so a stamp after a step's end while it had other
requests is that drain, however late after the end it came (:func:`engine_working`): on a dumped
calibration 121 of 634 busy sends were stamped 0.5-2.4 ms after their step's end, 105 of them
behind another request in the same drain (each intake costs the loop about 1 ms); read as
exact (version 19), each put its hop at its window's top, and the spread put 9% of the hops of
one to three running requests 3 ms or more above the line where the drains put none.
:func:`~.input_steps.fit_through_steps` fits the line (the typical hop) through those windows.
The spread around the line matters as much: on twenty main-job truths a request sent 2.5–3.5 ms
before the step in progress ended missed that step's end in 21 of 77 sends, one sent
4–7 ms before in 6 of 133; the simulation, every hop on the line, in 2 of 44 and 0 of 132. A
missed step end costs a whole step (7–10 ms), and those misses are the client TTFT's tail.

:func:`busy_hop_spread` estimates the hops' distribution from the windows without taking any
point in them (Turnbull's self-consistent estimate for interval-censored data: the distribution
whose probability of each request's window, all together, is largest), less each request's line,
and keeps its quantiles at :data:`~.input_spread.SPREAD_LEVELS`. The simulation draws each busy
send's way in from it (``vidur.frontend_busy_hop``), so a hop longer than the step in progress's
remainder misses that step as often as the replays' did.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpu_simulate_test.calibration.input_spread import SPREAD_BUCKETS, SPREAD_LEVELS, spread_bucket

KEY = "busy_hop_residual_ms"
"""``frontend.<KEY>``: the busy sends' hops less the line, quantiles per bucket of running
requests (:func:`merged_buckets`)."""
COUNT_KEY = "busy_hop_requests"
"""``frontend.<COUNT_KEY>``: how many busy sends it was read from."""
MIN_BUSY_HOPS = 50
"""Fewer busy sends than this: no spread (a window each says little alone)."""
GRID_MS = 0.05
"""The estimate's support: hops on this grid (ms)."""
MAX_HOP_MS = 60.0
"""The most a hop may lie above its line (ms): a window reaching further is cut there."""
ITERATIONS = 300
"""Self-consistency iterations (the masses settle well before: a change under 1e-6)."""


def engine_working(queued_s: np.ndarray, done_s: np.ndarray) -> np.ndarray:
    """Per request, whether the engine had another request at its queue stamp (queued before
    it, not yet finished: ``done_s``, its last token's stamp): such an engine never waits for
    input, so the stamp is where it drained its input between steps, not the arrival."""
    queued = np.asarray(queued_s, dtype=float)
    done = np.asarray(done_s, dtype=float)
    other = (queued[None, :] < queued[:, None]) & (done[None, :] > queued[:, None])
    return np.asarray(other.any(axis=1))


def hop_windows_ms(
    sent_s: np.ndarray,
    queued_s: np.ndarray,
    spans: np.ndarray,
    held_back_s: float,
    working: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Per request, the window its hop lies in (ms, low <= high): queued after the end of a step
    that ended after its send, within ``held_back_s`` of it or while the engine had other work
    (``working``, :func:`engine_working`: a drain between steps), it arrived while that step ran
    or before the drain (from the step's start or its send, whichever is later, to its queue
    stamp); otherwise on arrival (low = high, exact). ``spans``: the recorded steps, (start,
    end) rows (seconds)."""
    sent = np.asarray(sent_s, dtype=float)
    queued = np.asarray(queued_s, dtype=float)
    low, high = queued - sent, queued - sent
    if len(spans):
        spans = np.asarray(spans, dtype=float)
        spans = spans[np.argsort(spans[:, 1], kind="stable")]
        ends = spans[:, 1]
        k = np.searchsorted(ends, queued, side="right") - 1
        ok = k >= 0
        kk = np.maximum(k, 0)
        drained = queued - ends[kk] <= held_back_s
        if working is not None:
            drained = drained | np.asarray(working, dtype=bool)
        held = ok & drained & (ends[kk] > sent)
        start = np.maximum(np.asarray(spans[kk, 0], dtype=float), sent)
        low = np.where(held, start - sent, low)
        high = np.where(held, queued - sent, high)  # a drain: up to its stamp, not the end
    return 1e3 * np.maximum(low, 0.0), 1e3 * np.maximum(high, 0.0)


def self_consistent(low: np.ndarray, high: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Turnbull's estimate: masses on ``grid`` whose probability of every window [low, high]
    (an exact reading: the grid point nearest it) is largest together."""
    inside = (grid[None, :] >= low[:, None] - 1e-9) & (grid[None, :] <= high[:, None] + 1e-9)
    nearest = np.abs(grid[None, :] - low[:, None]).argmin(axis=1)
    empty = ~inside.any(axis=1) | (high - low < GRID_MS / 2)  # exact, or narrower than the grid
    inside[empty] = False
    inside[np.flatnonzero(empty), nearest[empty]] = True
    member = inside.astype(float)
    masses = np.full(len(grid), 1.0 / len(grid))
    for _ in range(ITERATIONS):
        weights = member * masses
        weights /= weights.sum(axis=1, keepdims=True)
        updated = weights.mean(axis=0)
        settled = float(np.abs(updated - masses).max()) < 1e-6
        masses = updated
        if settled:
            break
    return masses


def quantiles_at(grid: np.ndarray, masses: np.ndarray, levels: tuple[float, ...]) -> list[float]:
    """The estimate's quantiles at ``levels`` (the first grid point whose cumulative mass
    reaches each), increasing."""
    cumulative = np.cumsum(masses)
    index = np.minimum(np.searchsorted(cumulative, np.asarray(levels) - 1e-12), len(grid) - 1)
    return [float(v) for v in np.maximum.accumulate(grid[index])]


def merged_buckets(running: np.ndarray, least: int) -> list[tuple[int, np.ndarray]]:
    """The busy sends' buckets of running requests (:data:`~.input_spread.SPREAD_BUCKETS` from
    1), each merged with the ones above it until it holds ``least`` sends (the last, short,
    into the one below): (the lowest bucket with a send in it, which sends), increasing."""
    which = spread_bucket(np.maximum(running, 1))
    out: list[tuple[int, np.ndarray]] = []
    low, taken = None, np.zeros(len(running), dtype=bool)
    for b in (b for b in SPREAD_BUCKETS if b >= 1):
        mine = which == b
        if low is None and mine.any():
            low = b
        taken |= mine
        if low is not None and int(taken.sum()) >= least:
            out.append((low, taken))
            low, taken = None, np.zeros(len(running), dtype=bool)
    if low is not None:
        if out:
            out[-1] = (out[-1][0], out[-1][1] | taken)
        else:
            out.append((low, taken))
    return out


def busy_hop_spread(
    sent_s: Sequence[float] | np.ndarray,
    queued_s: Sequence[float] | np.ndarray,
    running: Sequence[int] | np.ndarray,
    spans: np.ndarray,
    line: dict[str, Any],
    held_back_s: float,
    running_max: float = float("inf"),
    done_s: Sequence[float] | np.ndarray | None = None,
) -> dict[str, Any]:
    """``frontend``'s busy-hop entries (empty under :data:`MIN_BUSY_HOPS` busy sends): the hops
    of the requests sent with others in flight (``running`` > 0), each request's window less
    its line (``line``'s ``input_ms + input_per_running_ms · min(running, running_max)``, as the
    simulation draws around it), estimated through ``spans`` (:func:`self_consistent`) per
    bucket of running requests (:func:`merged_buckets`: the API server's intake waits the
    longer the more it streams), its quantiles at the spread levels (ms). ``done_s``: each
    request's last token's stamp, for which stamps are drains (:func:`engine_working`; without
    it, only those within ``held_back_s`` of a step's end)."""
    at = np.asarray(running, dtype=float)
    busy = at > 0
    if int(busy.sum()) < MIN_BUSY_HOPS:
        return {}
    queued = np.asarray(queued_s, dtype=float)
    working = None if done_s is None else engine_working(queued, np.asarray(done_s, dtype=float))
    low, high = hop_windows_ms(
        np.asarray(sent_s, dtype=float)[busy],
        queued[busy],
        np.asarray(spans, dtype=float),
        held_back_s,
        None if working is None else working[busy],
    )
    slope = float(line.get("input_per_running_ms", 0.0))
    on_line = float(line["input_ms"]) + slope * np.minimum(at[busy], running_max)
    low, high = low - on_line, high - on_line
    floor = float(-on_line.max())  # no hop below zero
    low, high = np.clip(low, floor, MAX_HOP_MS), np.clip(high, floor, MAX_HOP_MS)
    # the windows' own span only: every mass outside it is zero
    grid = np.arange(float(low.min()), float(high.max()) + GRID_MS / 2, GRID_MS)
    spread = {}
    for bucket, mine in merged_buckets(at[busy], MIN_BUSY_HOPS):
        masses = self_consistent(low[mine], high[mine], grid)
        spread[str(bucket)] = [round(r, 4) for r in quantiles_at(grid, masses, SPREAD_LEVELS)]
    return {KEY: spread, COUNT_KEY: int(busy.sum())}
