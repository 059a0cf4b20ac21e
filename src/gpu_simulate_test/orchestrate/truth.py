"""The truth, trusted: a real run the host disturbed is marked, re-run within a budget, and said.

The real bench judges every run it makes (:mod:`gpu_simulate_test.core.host.disturbance`: late
sends, held-back streams, foreign CPU) and writes the verdict into its ``run_meta.json`` and
``summary.json`` (``disturbance``). :func:`trusted_truth` reads it: a disturbed run is kept (its
directory stays, as evidence) and the same workload is run again, after waiting for the machine
to go quiet, up to ``reruns`` times. The run the comparison uses is the first undisturbed one, or
the last when every attempt was disturbed, and then it is marked so: never silent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.core.host.busy import wait_for_quiet
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.io import layout
from gpu_simulate_test.orchestrate.configs import nested_in
from gpu_simulate_test.orchestrate.steps import QUIET, Stages, run_truth

QUIET_WAIT_S = 60.0
"""How long a re-run waits, at most, for the machine to go quiet first."""


@dataclass(frozen=True)
class Attempt:
    """One real run of the workload and the real bench's verdict on it."""

    real_dir: Path
    disturbed: bool
    reasons: tuple[str, ...]
    waited_s: float = 0.0
    """Seconds spent waiting for the machine to go quiet before this run."""
    went_quiet: bool = True
    """Whether it did (a re-run whose wait ran out starts on a busy machine)."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "real_dir": str(self.real_dir),
            "disturbed": self.disturbed,
            "reasons": list(self.reasons),
            "waited_for_quiet_s": round(self.waited_s, 1),
            "went_quiet": self.went_quiet,
        }


@dataclass(frozen=True)
class Truth:
    """Every attempt at one real run, in order; the last is the one that counts."""

    attempts: tuple[Attempt, ...]

    @property
    def real_dir(self) -> Path:
        return self.attempts[-1].real_dir

    @property
    def disturbed(self) -> bool:
        """Whether the run that counts is disturbed (every attempt was)."""
        return self.attempts[-1].disturbed

    @property
    def reruns(self) -> int:
        return len(self.attempts) - 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "real_dir": str(self.real_dir),
            "disturbed": self.disturbed,
            "reruns": self.reruns,
            "attempts": [a.to_dict() for a in self.attempts],
        }

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Truth:
        """Back from :meth:`to_dict` (a fidelity manifest's ``truth``)."""
        return cls(
            tuple(
                Attempt(
                    Path(a["real_dir"]),
                    bool(a["disturbed"]),
                    tuple(a.get("reasons", ())),
                    float(a.get("waited_for_quiet_s", 0.0)),
                    bool(a.get("went_quiet", True)),
                )
                for a in record["attempts"]
            )
        )

    def describe(self) -> str:
        """One line for a report: what was disturbed and what was done."""
        if self.reruns == 0 and not self.disturbed:
            return "undisturbed"
        done = f"{self.reruns} re-run(s)" if self.reruns else "not re-run (fidelity.reruns=0)"
        busy = sum(not a.went_quiet for a in self.attempts[1:])
        if busy:
            done += f", {busy} of them started before the machine went quiet (the wait ran out)"
        if self.disturbed:
            why = "; ".join(self.attempts[-1].reasons)
            return f"disturbed, {done}, every attempt disturbed: kept and marked ({why})"
        return f"{self.reruns} disturbed run(s) replaced by a re-run ({done})"


def verdict_of(real_dir: Path) -> tuple[bool, tuple[str, ...]]:
    """The real bench's disturbance verdict recorded in ``real_dir/run_meta.json``."""
    meta = json.loads((real_dir / layout.RUN_META).read_text())
    record = meta.get("disturbance") or {}
    return bool(record.get("disturbed", False)), tuple(record.get("reasons", ()))


def rerun_id(run_id: str, k: int) -> str:
    """The run id of a real run's ``k``-th re-run (``k`` = 0: the run itself)."""
    return run_id if k == 0 else f"{run_id}-rerun{k}"


def trusted_truth(
    cfg: PipelineStageConfig,
    workload_dir: Path | str,
    stages: Stages = QUIET,
    run_id: str | None = None,
    reruns: int = 0,
    quiet_wait_s: float = QUIET_WAIT_S,
    label: str = "real_bench",
    rerun_root: Path | None = None,
) -> Truth:
    """The real bench of ``cfg`` on ``workload_dir`` (:func:`.steps.run_truth`, recorded in
    ``stages`` as ``label``, a re-run as ``<label>_rerun<k>``), re-run while the real bench
    marks it disturbed, ``reruns`` times at most (``<run_id>-rerun<k>``, under ``rerun_root``
    when given: an orchestrator's own run directory)."""
    base = run_id or cfg.output.run_id
    again = nested_in(cfg, rerun_root)
    attempts: list[Attempt] = []
    for k in range(reruns + 1):
        waited, quiet = 0.0, True
        if k:
            quiet, waited = wait_for_quiet(quiet_wait_s)
            if not quiet:
                console.print(
                    f"[yellow]the machine did not go quiet within {quiet_wait_s:g} s: re-running "
                    "anyway"
                )
        this_id = rerun_id(base or attempts[0].real_dir.name, k) if k else base
        name = label if k == 0 else f"{label}_rerun{k}"
        real_dir = run_truth(again if k else cfg, workload_dir, stages, this_id, name)
        disturbed, reasons = verdict_of(real_dir)
        attempts.append(Attempt(real_dir, disturbed, reasons, waited, quiet))
        if not disturbed:
            break
        if cfg.progress or k < reruns:
            left = "re-running" if k < reruns else "no re-run left: kept and marked"
            why = "; ".join(reasons)
            console.print(f"[yellow]real run {real_dir.name} disturbed ({why}): {left}")
    return Truth(tuple(attempts))
