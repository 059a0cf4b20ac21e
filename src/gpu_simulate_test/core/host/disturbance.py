"""Was a real run disturbed? Three signs, each measured, compared with a limit and said.

Every fidelity figure divides by the real run, so a real run the host disturbed must never pass
for truth in silence. A run is judged on what it recorded:

- **Late sends**: the client sent requests later than scheduled (``arrival_error_s`` of
  ``request_metrics``): the load the engine was offered is not the workload's. A send is late
  over :data:`LATE_SEND_LIMIT_MS`; the run is disturbed when more of the isolated sends
  (scheduled at least :data:`ISOLATED_GAP_MS` after the one before) are late than
  :func:`late_sends_allowed` lets pass: 1% of them (the p99 over the limit, as before), but
  never fewer than :data:`LATE_SENDS_ALLOWED`, so that one send out of a 40-request run (where
  the p99 is the maximum) cannot decide the verdict. Sends scheduled closer together than that (a
  burst) wait for each other in any client that sends one at a time: over a bursty campaign's
  16 runs their p99 was 2.0–4.5 ms, the isolated sends' 0.7–2.2 ms but for one run at 3.8.
  Those are recorded in the detail, not judged.
- **Held-back streams**: tokens generated in time and delivered in bursts. Two tokens of one
  request are at least one engine step apart when the engine makes them, so a gap between two
  output events far below the engine's step time (under :data:`HELD_BACK_STEP_FRACTION` of the
  median step of its own step log) was held back between the engine and the client. Disturbed
  when more than :data:`HELD_BACK_SHARE_LIMIT` of all gaps are.
- **Foreign CPU**: other processes (not this one, the server it started or the shell waiting
  for it) used more than :data:`FOREIGN_CORES_LIMIT` cores on average during the replay
  (:class:`gpu_simulate_test.core.host.busy.ForeignLoad`).

A sign that cannot be measured (no step log, a server that is not ours) is reported as not
measured, never as passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from gpu_simulate_test.core.host.busy import FOREIGN_CORES_LIMIT
from gpu_simulate_test.core.metrics import percentiles as pct

LATE_SEND_LIMIT_MS = 2.0
"""A send this much later than scheduled is late."""
LATE_SENDS_ALLOWED = 2
"""Late isolated sends a run may have whatever its size: at 40 requests the p99 is the
maximum, and one late send (1–2 of 39 in fresh ``make run``s of 2026-12-01) would decide."""
ISOLATED_GAP_MS = 2.0
"""A send scheduled at least this long after the one before is isolated: a client that sends
one request at a time has had the time to send the one before."""
HELD_BACK_STEP_FRACTION = 0.25
"""A token gap under this fraction of the engine's median step was held back on its way."""
HELD_BACK_SHARE_LIMIT = 0.05
"""More than this share of held-back gaps is a disturbed stream (a few are delivery jitter)."""

LATE_SENDS = "late_sends"
NOT_JUDGED = "not judged: "
"""How a real run's ``run_meta.json`` ``disturbance.note`` begins when nothing judged it (a run
imported from a tool that records no such signs)."""
HELD_BACK_STREAMS = "held_back_streams"
FOREIGN_CPU = "foreign_cpu"
SIGNS: tuple[str, ...] = (LATE_SENDS, HELD_BACK_STREAMS, FOREIGN_CPU)


@dataclass(frozen=True)
class Sign:
    """One sign's measurement: its figure against its limit, or why it was not measured."""

    name: str
    measured: bool
    disturbed: bool
    figure: float | None
    limit: float
    unit: str
    detail: str

    def message(self) -> str:
        if not self.measured:
            return f"{self.name}: not measured ({self.detail})"
        verdict = "over" if self.disturbed else "within"
        return (
            f"{self.name}: {self.figure:.4g} {self.unit}, {verdict} the limit {self.limit:g} "
            f"({self.detail})"
        )


@dataclass(frozen=True)
class Verdict:
    """Every sign of one run; ``disturbed`` when any measured sign is over its limit."""

    signs: tuple[Sign, ...] = field(default_factory=tuple)

    @property
    def disturbed(self) -> bool:
        return any(s.disturbed for s in self.signs)

    @property
    def reasons(self) -> list[str]:
        return [s.message() for s in self.signs if s.disturbed]

    def to_dict(self) -> dict[str, Any]:
        """What ``run_meta.json`` and ``summary.json`` carry (``disturbance``)."""
        return {
            "disturbed": self.disturbed,
            "reasons": self.reasons,
            "signs": {s.name: asdict(s) for s in self.signs},
        }


def late_sends_allowed(judged: int) -> int:
    """How many of ``judged`` isolated sends may be late in an undisturbed run: 1% of them
    (a p99 within the limit), at least :data:`LATE_SENDS_ALLOWED`."""
    return max(LATE_SENDS_ALLOWED, judged // 100)


def late_sends(arrival_errors_s: npt.ArrayLike, scheduled_s: npt.ArrayLike | None = None) -> Sign:
    """The late-send sign of a run's ``arrival_error_s`` column, judged on the isolated sends
    when their scheduled times (``scheduled_s``, same order) are given, else on every send: the
    number of late sends against :func:`late_sends_allowed`."""
    errors = np.asarray(arrival_errors_s, dtype=float)
    allowed = late_sends_allowed(errors.size)
    if errors.size == 0:
        return Sign(LATE_SENDS, False, False, None, allowed, "late sends", "no request sent")
    judged, clumped = errors, ""
    if scheduled_s is not None:
        scheduled = np.asarray(scheduled_s, dtype=float)
        order = np.argsort(scheduled, kind="stable")
        gaps = np.diff(scheduled[order], prepend=-np.inf)
        isolated = np.zeros(errors.size, dtype=bool)
        isolated[order] = gaps * 1e3 >= ISOLATED_GAP_MS
        judged = errors[isolated]
        if (~isolated).any():
            burst = pct.describe(errors[~isolated], scale=1e3)
            clumped = (
                f"; {burst.count} sends scheduled under {ISOLATED_GAP_MS:g} ms after the one "
                f"before, not judged: p99 {burst.stat('p99'):.3g} ms"
            )
    summary = pct.describe(judged, scale=1e3)
    late = int(np.sum(judged * 1e3 > LATE_SEND_LIMIT_MS))
    allowed = late_sends_allowed(summary.count)
    what = "isolated sends" if scheduled_s is not None else "sends"
    detail = (
        f"{late} of {summary.count} {what} over {LATE_SEND_LIMIT_MS:g} ms late, at most "
        f"{allowed} allowed; arrival error p99 {summary.stat('p99'):.3g} ms, max "
        f"{summary.max:.3g} ms" + clumped
    )
    return Sign(LATE_SENDS, True, late > allowed, float(late), allowed, "late sends", detail)


def held_back_streams(gaps_s: Sequence[float], step_ms: Sequence[float]) -> Sign:
    """The held-back-stream sign: the share of output-event gaps (``gaps_s``, every request's,
    pooled) under :data:`HELD_BACK_STEP_FRACTION` of the median engine step (``step_ms``: the
    step log's ``elapsed_ms`` of steps that generated tokens)."""
    steps = pct.describe(step_ms)
    gaps = np.asarray(gaps_s, dtype=float)
    gaps = gaps[np.isfinite(gaps)]
    if steps.count == 0:
        return Sign(HELD_BACK_STREAMS, False, False, None, HELD_BACK_SHARE_LIMIT, "share",
                    "no engine step log to compare the gaps with")  # fmt: skip
    if gaps.size == 0:
        return Sign(HELD_BACK_STREAMS, False, False, None, HELD_BACK_SHARE_LIMIT, "share",
                    "no request with two output events")  # fmt: skip
    floor_ms = HELD_BACK_STEP_FRACTION * steps.median
    held = int(np.sum(gaps * 1e3 < floor_ms))
    share = held / gaps.size
    detail = (
        f"{held} of {gaps.size} token gaps under {floor_ms:.3g} ms "
        f"({HELD_BACK_STEP_FRACTION:g} of the engine's median step, {steps.median:.3g} ms)"
    )
    return Sign(
        HELD_BACK_STREAMS, True, share > HELD_BACK_SHARE_LIMIT, share, HELD_BACK_SHARE_LIMIT,
        "share", detail,
    )  # fmt: skip


def foreign_cpu(cores: float | None, why_not: str = "") -> Sign:
    """The foreign-CPU sign of :class:`~gpu_simulate_test.core.host.busy.ForeignLoad`'s reading
    (None: not measured, ``why_not`` says why)."""
    if cores is None:
        return Sign(FOREIGN_CPU, False, False, None, FOREIGN_CORES_LIMIT, "cores", why_not)
    return Sign(
        FOREIGN_CPU, True, cores > FOREIGN_CORES_LIMIT, cores, FOREIGN_CORES_LIMIT, "cores",
        "other processes' CPU during the replay, on average",
    )  # fmt: skip


def judge(
    arrival_errors_s: npt.ArrayLike,
    gaps_s: Sequence[float],
    step_ms: Sequence[float],
    foreign_cores: float | None,
    foreign_why_not: str = "",
    scheduled_s: npt.ArrayLike | None = None,
) -> Verdict:
    """Every sign of one run (late sends judged on the isolated ones with ``scheduled_s``)."""
    return Verdict(
        (
            late_sends(arrival_errors_s, scheduled_s),
            held_back_streams(gaps_s, step_ms),
            foreign_cpu(foreign_cores, foreign_why_not),
        )
    )


def is_disturbed(meta: Mapping[str, Any]) -> bool:
    """Whether a real run's ``run_meta.json`` (or ``summary.json``) marks it disturbed."""
    return bool((meta.get("disturbance") or {}).get("disturbed", False))
