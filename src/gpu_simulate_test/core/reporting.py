"""Terminal output shared by the stages: one rich console, progress bars and tables."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table
from rich.text import Text

console = Console(stderr=False)


@contextlib.contextmanager
def progress_bar(
    description: str, total: int, enabled: bool = True
) -> Iterator[Callable[[int], None]]:
    """Yield ``advance(n)``; draws a bar (count, elapsed, remaining) when enabled."""
    if not enabled:
        yield lambda _n: None
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task(description, total=total)
        yield lambda n: progress.advance(task, n)


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    table = Table(title=title)
    for name in header:
        table.add_column(name)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A GitHub markdown table of already formatted cells (no trailing newline)."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def markdown_text(line: str) -> Text:
    """One line of a report's markdown for the terminal: its ``**bold**`` parts bold, the rest
    as written (no rich markup read in it)."""
    text = Text()
    for k, part in enumerate(line.split("**")):
        text.append(part, style="bold" if k % 2 else "")
    return text
