"""Finding the Nsight binaries, and a typed outcome for steps that may be skipped."""

from __future__ import annotations

import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

ToolName = Literal["nsys", "ncu"]
StepStatus = Literal["ok", "skipped", "failed"]
STEP_STATUSES: tuple[str, ...] = ("ok", "skipped", "failed")

CUDA_BIN_DIRS: tuple[str, ...] = ("/usr/local/cuda/bin", "/opt/nvidia/nsight-compute")
"""Where CUDA installs put the tools when they are not on PATH (CUDA_HOME/bin is tried first)."""


def find_tool(name: ToolName, path: str | None = None) -> str | None:
    """Absolute path of ``nsys`` or ``ncu``: on ``path`` (default $PATH), then $CUDA_HOME/bin and
    the usual CUDA directories; None when absent."""
    found = shutil.which(name, path=path)
    if found:
        return found
    if path is not None:
        return None
    dirs = [os.path.join(os.environ["CUDA_HOME"], "bin")] if os.environ.get("CUDA_HOME") else []
    for directory in (*dirs, *CUDA_BIN_DIRS):
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return None


@dataclass(frozen=True)
class StepOutcome:
    """What happened to one step of a stage; ``reason`` is required unless it went ok."""

    step: str
    status: StepStatus
    reason: str = ""

    def __post_init__(self) -> None:
        if self.status not in STEP_STATUSES:
            raise ValueError(f"status={self.status!r} is not one of {', '.join(STEP_STATUSES)}")
        if self.status != "ok" and not self.reason:
            raise ValueError(f"step {self.step!r} is {self.status} but gives no reason")

    @classmethod
    def ok(cls, step: str) -> StepOutcome:
        return cls(step, "ok")

    @classmethod
    def skipped(cls, step: str, reason: str) -> StepOutcome:
        return cls(step, "skipped", reason)

    @classmethod
    def failed(cls, step: str, reason: str) -> StepOutcome:
        return cls(step, "failed", reason)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def require_tool(
    name: ToolName, step: str, path: str | None = None
) -> tuple[str | None, StepOutcome]:
    """(tool path, outcome): ``skipped`` with a reason naming the tool when it is not installed."""
    found = find_tool(name, path)
    if found is None:
        return None, StepOutcome.skipped(step, f"{name} not found on PATH or in CUDA directories")
    return found, StepOutcome.ok(step)
