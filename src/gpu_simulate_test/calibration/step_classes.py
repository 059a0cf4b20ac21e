"""Which steps does the model time wrong? A server's busy steps, class by class.

A server's step level (:mod:`.level`) is its busy steps' measured time over the step model's, all
of them together. This splits the same steps by what they hold: decodes only, a whole prompt
(its first chunk, nothing computed before), a prompt's later chunk (a prefill over KV it computed
in an earlier step: a token budget of 32 cuts 16..64-token prompts into two or three), each with
or without decodes beside it; per class, the measured seconds over the modelled ones, and the
steps' share of the busy time (``benchmarks/calibration/step_classes.py`` prints it for a tune's
checked servers).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from gpu_simulate_test.calibration.level import busy_steps


def step_class(chunks: tuple[tuple[int, int], ...]) -> str:
    """What a step holds: ``decode`` only, a ``first chunk`` (a prompt with nothing computed
    before) or a ``later chunk`` (a prefill over KV of its own from an earlier step), each
    ``+ decodes`` when decodes ran beside it."""
    prefills = [(q, kv) for q, kv in chunks if q > 1]
    decodes = len(chunks) - len(prefills)
    if not prefills:
        return "decode"
    kind = "later chunk" if any(kv > q for q, kv in prefills) else "first chunk"
    return kind + (" + decodes" if decodes else "")


def classes(schedules: list[pd.DataFrame], model: tuple[Any, Any]) -> pd.DataFrame:
    """Per step class over the runs: steps, measured and modelled busy seconds, their ratio."""
    rows: list[tuple[str, float, float]] = []
    for schedule in schedules:
        features, body, modelled = busy_steps(schedule, *model)
        rows += zip(features["chunks"].map(step_class), body, modelled, strict=True)
    frame = pd.DataFrame(rows, columns=["class", "measured_s", "modelled_s"])
    out = frame.groupby("class").agg(
        steps=("measured_s", "size"),
        measured_s=("measured_s", "sum"),
        modelled_s=("modelled_s", "sum"),
    )
    out["ratio"] = out["measured_s"] / out["modelled_s"]
    out["share"] = out["measured_s"] / out["measured_s"].sum()
    return out
