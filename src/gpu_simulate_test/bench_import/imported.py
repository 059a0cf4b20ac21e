"""A benchmark run read from another tool's result file, in one shape for every tool, and the
checks every import makes (no I/O here: the readers parse, :mod:`.write` writes)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from gpu_simulate_test.config.schema import ModelConfig
from gpu_simulate_test.core.metrics.latency import tpot_s
from gpu_simulate_test.io.artifacts import ArtifactError

Floats = npt.NDArray[np.float64]
Ints = npt.NDArray[np.int64]

AGREE_REL = 1e-6
"""How close a summary the tool saved must be to the same figure recomputed from its
per-request fields for the convention to count as confirmed (both are float64 sums)."""


@dataclass(frozen=True)
class ImportedRun:
    """One benchmark run of another tool, per request in the file's order, times in seconds.

    ``send_time_s`` is when the tool sent each request, on its own clock (any origin);
    ``scheduled_time_s`` when it meant to (before its own client-side queue, if any).
    ``event_offsets_s[i]`` holds request i's output events (streamed chunks) from its send, the
    first being its TTFT; empty where the tool kept no per-event times.
    """

    tool: str
    source: Path
    label: str
    ok: npt.NDArray[np.bool_]
    send_time_s: Floats
    scheduled_time_s: Floats
    num_prefill_tokens: Ints
    num_decode_tokens: Ints
    ttft_s: Floats
    e2e_s: Floats
    event_offsets_s: tuple[Floats, ...]
    errors: tuple[str, ...]
    conventions: dict[str, Any] = field(default_factory=dict)
    """Each metric as the tool defines it and how the file confirmed it (:func:`convention`)."""
    settings: dict[str, Any] = field(default_factory=dict)
    """The tool's run-level settings and summaries as it saved them (rate, model, version)."""
    fields: dict[str, str] = field(default_factory=dict)
    """Where each checked quantity (``ttft``, ``latency``, ``input_lens``, ...) is in the tool's
    file, ``{i}`` standing for the request's index; a name not here is the file's own."""

    @property
    def num_requests(self) -> int:
        return len(self.ok)

    def where(self, fieldname: str, index: int | None = None) -> str:
        """``<file> (<label>), field <name>`` for error messages, the field as the tool's file
        names it (:attr:`fields`; request ``index`` where its path holds one)."""
        label = f" ({self.label})" if self.label else ""
        name = self.fields.get(fieldname, fieldname)
        if "{i}" in name:
            name = name.replace("{i}", "" if index is None else str(index))
        return f"{self.source}{label}, field {name!r}"


def convention(definition: str, tool_value: float | None, recomputed: float, what: str) -> dict:
    """A metric convention and its check: the tool's saved summary ``tool_value`` against the
    same summary recomputed from the per-request fields under ``definition``."""
    if tool_value is None or not np.isfinite(tool_value):
        return {"definition": definition, "checked": False, "note": f"the file has no {what}"}
    scale = max(abs(tool_value), abs(recomputed), 1e-12)
    agrees = abs(tool_value - recomputed) <= AGREE_REL * scale
    return {
        "definition": definition,
        "checked": True,
        "agrees": bool(agrees),
        "note": f"{what}: file {tool_value:.6g}, recomputed {recomputed:.6g}",
    }


def disagreements(conventions: Mapping[str, Any]) -> list[str]:
    """The conventions a file contradicted (their notes), for the printout and the manifest."""
    return [
        f"{name}: {c['note']}"
        for name, c in conventions.items()
        if isinstance(c, Mapping) and c.get("checked") and not c.get("agrees")
    ]


def per_request_tpot_s(run: ImportedRun) -> Floats:
    """``vllm bench serve``'s TPOT of each request (our one definition)."""
    return np.asarray(tpot_s(run.ttft_s, run.e2e_s, run.num_decode_tokens), dtype=float)


def check_run(run: ImportedRun, model: ModelConfig) -> None:
    """Fail, naming the file and field, on what no real run can hold: no successful request,
    negative times, lengths the model cannot serve, events out of order."""
    if not run.ok.any():
        raise ArtifactError(
            f"{run.where('errors')}: no request succeeded ({run.num_requests} failed), nothing to "
            "import; re-run the benchmark once the server answers"
        )
    ok = np.flatnonzero(run.ok)
    for name, values in (("start_times", run.send_time_s), ("queue_times", run.scheduled_time_s)):
        bad = ok[~np.isfinite(values[ok])]
        if bad.size:
            i = int(bad[0])
            raise ArtifactError(
                f"{run.where(name, i)}: request {i} (0-based) has {_said(values[i])}, expected "
                "a time in seconds for a successful request"
            )
    for name, values in (("ttft", run.ttft_s), ("latency", run.e2e_s)):
        bad = ok[~(np.isfinite(values[ok]) & (values[ok] >= 0))]
        if bad.size:
            i = int(bad[0])
            raise ArtifactError(
                f"{run.where(name, i)}: request {i} (0-based) has {name} {_said(values[i])}, "
                "expected a time in seconds >= 0 for a successful request"
            )
    shorter = ok[run.e2e_s[ok] < run.ttft_s[ok] - 1e-9]
    if shorter.size:
        i = int(shorter[0])
        raise ArtifactError(
            f"{run.where('latency', i)}: request {i} ends ({run.e2e_s[i]:.6f} s) before its first "
            f"token ({run.ttft_s[i]:.6f} s); expected end-to-end latency >= TTFT"
        )
    for name, lengths in (
        ("input_lens", run.num_prefill_tokens),
        ("output_lens", run.num_decode_tokens),
    ):
        short = ok[lengths[ok] < 1]
        if short.size:
            i = int(short[0])
            raise ArtifactError(
                f"{run.where(name, i)}: request {i} (0-based) has {lengths[i]} tokens, expected "
                ">= 1 for a successful request"
            )
    total = run.num_prefill_tokens + run.num_decode_tokens
    over = ok[total[ok] > model.max_position_embeddings]
    if over.size:
        i = int(over[0])
        raise ArtifactError(
            f"{run.where('input_lens', i)}: request {i} has {run.num_prefill_tokens[i]} prompt + "
            f"{run.num_decode_tokens[i]} output tokens, over model {model.name}'s context of "
            f"{model.max_position_embeddings}; pass the model the run served (model=<name>, "
            "e.g. model=qwen3_0_6b)"
        )
    for i in ok:
        events = run.event_offsets_s[i]
        if events.size == 0:
            continue
        if not np.isfinite(events).all():
            raise ArtifactError(
                f"{run.where('itls')}: request {i} has an empty, null or NaN gap between its "
                "tokens; expected every gap in seconds >= 0"
            )
        if events.size > run.num_decode_tokens[i]:
            raise ArtifactError(
                f"{run.where('itls')}: request {i} has {events.size} output events for "
                f"{run.num_decode_tokens[i]} output tokens; expected at most one event per token"
            )
        if np.any(np.diff(events) < 0) or abs(events[0] - run.ttft_s[i]) > 1e-6:
            raise ArtifactError(
                f"{run.where('itls')}: request {i}'s token times go backwards or do not start "
                "at its TTFT; expected gaps >= 0 after the first token"
            )


def _said(value: float) -> str:
    """A value as a message says it: ``NaN`` or ``null`` (a missing value), else the number."""
    return "null or NaN" if np.isnan(value) else f"{float(value):g}"
