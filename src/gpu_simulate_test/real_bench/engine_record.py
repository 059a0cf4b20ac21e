"""What a real run records of its engine, never dropped in silence: the backend's description
(``describe_error`` where it fails), the engine's own step log (a step log that stayed empty
while the engine served requests fails the run; step lines that could not be read are said) and,
with prefix caching, where its two records of a request's cached tokens differ (said)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.markup import escape

from gpu_simulate_test.core.engines import Backend
from gpu_simulate_test.core.reporting import console
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError


def describe(backend: Backend) -> dict[str, Any]:
    """``backend.describe()``, or where it fails ``describe_error`` (``<type>: <message>``) for
    ``run_meta.json`` ``backend``, said as a warning."""
    try:
        return backend.describe()
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
        console.print(
            f"[yellow]warning:[/] backend {backend.name} could not describe itself "
            f"({escape(error)}); run_meta.json backend.describe_error records it",
            soft_wrap=True,
        )
        return {"describe_error": error}


def check_step_log(run_dir: Path, engine_log: Mapping[str, Any], served_ok: int) -> None:
    """Say how many step lines of the server's log could not be read (``engine_log``
    ``unreadable_step_lines``), and fail the run when its step log is empty although the engine
    served ``served_ok`` requests: its steps went unseen. A run without a step log
    (``engine_steps`` absent or None: an in-process engine, a server without ``log_file``) has
    nothing to check."""
    unreadable = int(engine_log.get("unreadable_step_lines") or 0)
    examples = list(engine_log.get("unreadable_step_line_examples") or [])
    example = f", e.g. {examples[0]!r}" if examples else ""
    if unreadable:
        console.print(
            f"[yellow]warning:[/] {unreadable} step line(s) of the server's log could not be "
            f"read (run_meta.json engine_log.unreadable_step_lines){escape(example)}",
            soft_wrap=True,
        )
    if engine_log.get("engine_steps") == 0 and served_ok > 0:
        raise ArtifactError(
            f"{run_dir / layout.ENGINE_STEP_LOG}: no engine step was read off the server's log "
            f"although the engine served {served_ok} request(s) (vLLM logs one line per step "
            "with --enable-logging-iteration-details)"
            + (
                f"; {unreadable} line(s) looked like steps but could not be read{example}"
                if unreadable
                else ""
            )
        )


def check_cached_tokens(engine_log: Mapping[str, Any], served_ok: int) -> None:
    """Say (not fail) where the server's ``cached_tokens`` and its scheduler's admission hit
    differ for a request (``engine_log.cached_tokens_check``, prefix caching on); and where the
    server reported none although its cache is on (a server started without
    ``--enable-prompt-tokens-details``)."""
    check = engine_log.get("cached_tokens_check")
    if not check:
        return
    if check.get("disagreements"):
        shown = ", ".join(
            f"{d['request_id']} ({d['usage']} vs {d['scheduler']})"
            for d in check["disagreeing"][:5]
        )
        console.print(
            f"[yellow]warning:[/] {check['disagreements']} of {check['requests_compared']} "
            "request(s) have other cached tokens in the server's usage than its scheduler "
            f"recorded at admission: {shown} (run_meta.json engine_log.cached_tokens_check)",
            soft_wrap=True,
        )
    if not check.get("usage_reported") and served_ok > 0:
        console.print(
            "[yellow]warning:[/] prefix caching is on but the server reported no cached tokens "
            "(start it with --enable-prompt-tokens-details): request_metrics.csv cached_tokens "
            "is empty",
            soft_wrap=True,
        )
