"""What ``--help`` says for each stage: its purpose, examples, where its outputs go, its main
knobs with the defaults it really runs with, and its config groups, in under 60 lines.

Hydra's own help is a dump of the composed config (170 to 270 lines) that says neither what a
stage is for nor how to call it. Each stage's primary config overrides ``hydra/help`` with the
node :func:`help_node` builds here (``cli/registry.py`` stores one per stage), so the help goes
through Hydra's mechanism: ``$APP_CONFIG_GROUPS`` is still Hydra's list of groups, and
``hydra.help.header`` can be overridden like any key. The config itself stays one flag away
(``--cfg job``), and the pages themselves live in :mod:`gpu_simulate_test.cli.help_pages`.

A knob's value is the one the composed config holds (a test composes every stage and compares);
a knob the stage derives at run time (the pipeline's Vidur scheduler from ``backend.*``) says
from what, since the raw config shows a value the run never uses.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

__all__ = (
    "CONFIG_GROUPS",
    "CONFIG_GROUPS_TITLE",
    "Example",
    "Knob",
    "StageHelp",
    "derived",
    "help_footer",
    "help_header",
    "help_node",
    "help_template",
    "knob",
    "required",
)

CONFIG_GROUPS_TITLE = "== Configuration groups =="
MODULE = "python -m gpu_simulate_test.cli"
CONFIG_GROUPS = ("backend", "hardware", "model", "workload")
"""The config groups under ``configs/`` besides ``experiment`` (a test holds them equal)."""
COMMENT_COLUMN = 60
"""Example comments line up here, unless the command is longer."""


@dataclass(frozen=True)
class Example:
    """One command a user can paste, and what it does (a short comment). ``more`` continues a
    long command on a second line (after a ``\\``, as a shell reads it)."""

    command: str
    comment: str
    more: str = ""


@dataclass(frozen=True)
class Knob:
    """A main knob: ``name=value`` and its meaning. ``value`` is the composed config's default;
    ``derived_from`` (config keys) marks a value set at run time from those keys, and
    ``required`` a key the user must give (the config holds ``???``)."""

    name: str
    meaning: str
    value: str = ""
    derived_from: tuple[str, ...] = ()
    required: bool = False

    @property
    def label(self) -> str:
        """The left column: ``name=value``, or the name and why no value is shown."""
        if self.derived_from:
            return f"{self.name}=<derived>"
        if self.required:
            return f"{self.name}=<required>"
        return f"{self.name}={self.value}"

    @property
    def text(self) -> str:
        """The right column: the meaning, after what a derived value comes from."""
        if self.derived_from:
            return f"from {', '.join(self.derived_from)}: {self.meaning}"
        return self.meaning


def knob(name: str, value: str, meaning: str) -> Knob:
    """A knob with its default as the composed config holds it (YAML spelling: ``null``,
    ``true``, ``4.0``, ``[1,2]``)."""
    return Knob(name=name, meaning=meaning, value=value)


def derived(name: str, sources: tuple[str, ...], meaning: str) -> Knob:
    """A knob the stage sets at run time from ``sources``: its raw config value is not shown."""
    return Knob(name=name, meaning=meaning, derived_from=sources)


def required(name: str, meaning: str) -> Knob:
    """A knob with no default: the stage refuses to run without it."""
    return Knob(name=name, meaning=meaning, required=True)


@dataclass(frozen=True)
class StageHelp:
    """One stage's help page.

    ``groups`` are the config groups its defaults list picks, with the option picked
    (``(("model", "qwen3_tiny"), ...)``); ``presets`` the ``experiment`` configs written for it.
    """

    purpose: tuple[str, ...]
    examples: tuple[Example, ...]
    outputs: tuple[str, ...]
    knobs: tuple[Knob, ...]
    groups: tuple[tuple[str, str], ...] = ()
    presets: tuple[str, ...] = ()
    docs: str = ""
    """The stage's page, when it is not ``docs/<stage>.md``."""


def _examples(page: StageHelp) -> list[str]:
    """One line per command (two for a long one), its comment lined up at the right."""
    lines = []
    for example in page.examples:
        last = f"  {example.command}"
        if example.more:
            lines.append(f"{last} \\")
            last = f"      {example.more}"
        lines.append(last.ljust(COMMENT_COLUMN) + f"  # {example.comment}")
    return lines


def _knobs(page: StageHelp) -> list[str]:
    """``name=value`` in a column of its own, the meaning beside it."""
    width = max(len(k.label) for k in page.knobs)
    return [f"  {k.label.ljust(width)}  {k.text}" for k in page.knobs]


def _groups(stage: str, page: StageHelp) -> list[str]:
    """What the stage picks from Hydra's groups listed below, and its ``experiment`` presets."""
    if page.groups:
        picked = " ".join(f"{group}={option}" for group, option in page.groups)
        lines = [f"Defaults: {picked} (group=option picks another)"]
        taken = {group for group, _ in page.groups}
        others = [g for g in CONFIG_GROUPS if g not in taken]
        if others:  # Hydra lists every group below; group=option is refused for these
            lines.append(f"Not taken by {stage}: {', '.join(others)} (other stages' groups)")
    else:
        lines = [f"{stage} takes none of these groups: it reads run directories"]
    if page.presets:
        presets = f"Presets (+experiment=<name>): {', '.join(page.presets)}"
        lines += textwrap.wrap(presets, width=100, subsequent_indent="  ", break_on_hyphens=False)
    return lines


def help_header(stage: str, page: StageHelp) -> str:
    """Everything above the config groups: purpose, examples, outputs, main knobs, docs."""
    lines = [f"{stage}: {page.purpose[0]}", *page.purpose[1:], "", "Examples:"]
    lines += _examples(page)
    lines += ["", "Outputs:", *(f"  {line}" for line in page.outputs)]
    lines += ["", "Main knobs (defaults as they run):", *_knobs(page)]
    lines += ["", f"Docs: {page.docs or f'docs/{stage}.md'}"]
    return "\n".join(lines) + "\n\n"


def help_footer(stage: str) -> str:
    """How to see the whole config, and Hydra's own help."""
    return (
        f"Full config: {MODULE}.{stage} --cfg job   (one part: --cfg job --package backend)\n"
        "Hydra's own flags: --hydra-help\n"
    )


def help_template(stage: str, page: StageHelp) -> str:
    """Hydra's help template: the header, the config groups (``$APP_CONFIG_GROUPS``, Hydra's
    list) with this stage's own, and the footer; no ``$CONFIG`` (the config dump)."""
    groups = "\n".join(_groups(stage, page))
    return (
        "${hydra.help.header}"
        f"{CONFIG_GROUPS_TITLE}\n{groups}\n\n$APP_CONFIG_GROUPS\n"
        "${hydra.help.footer}"
    )


def help_node(stage: str, page: StageHelp) -> dict[str, str]:
    """The ``hydra/help`` config of ``stage`` (Hydra's ``HelpConf``: app_name, header, footer,
    template).

    Hydra resolves the node with OmegaConf and then fills the template with
    :class:`string.Template`, so a ``$`` in a page would be read as a variable: it is refused
    here, as is anything but ASCII (a terminal without UTF-8 would fail to print it).
    """
    header, footer = help_header(stage, page), help_footer(stage)
    own = (header + footer + "\n".join(_groups(stage, page))).splitlines()
    bad = [line for line in own if "$" in line or not line.isascii()]
    if bad:
        raise ValueError(f"help of {stage}: '$' or non-ASCII text in {bad[0]!r}")
    return {
        "app_name": stage,
        "header": header,
        "footer": footer,
        "template": help_template(stage, page),
    }
