"""Each stage's ``--help``: short (60 lines at most), with examples, outputs and config groups
instead of Hydra's config dump, and main knobs whose values are the defaults the stage runs with.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from gpu_simulate_test.cli.help_pages import STAGE_HELP
from gpu_simulate_test.cli.help_text import (
    CONFIG_GROUPS,
    CONFIG_GROUPS_TITLE,
    Knob,
    StageHelp,
    derived,
    help_node,
    help_template,
    knob,
    required,
)
from gpu_simulate_test.config.registry import CONFIG_DIR, STAGE_SCHEMAS

REPO = Path(__file__).resolve().parents[3]
STAGES = sorted(STAGE_HELP)
MAX_LINES = 60
ABSENT = object()


def test_every_stage_has_a_help_page() -> None:
    assert set(STAGE_HELP) == set(STAGE_SCHEMAS)


@pytest.mark.parametrize("stage", STAGES)
def test_help_is_short_and_says_what_how_and_where(stage: str, tmp_path: Path) -> None:
    """``--help`` as a user runs it (a process of its own, anywhere): purpose, examples that
    start with the stage's command (or ``make``), where outputs go, the config groups and how to
    see the whole config; not the config dump it replaces."""
    proc = subprocess.run(
        [sys.executable, "-m", f"gpu_simulate_test.cli.{stage}", "--help"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) <= MAX_LINES, proc.stdout
    assert lines[0].startswith(f"{stage}: ")
    examples = lines[lines.index("Examples:") + 1 :]
    commands = [line.strip() for line in examples[: examples.index("")]]
    assert any(
        c.startswith((f"python -m gpu_simulate_test.cli.{stage}", "make ")) for c in commands
    )
    assert "Outputs:" in lines
    assert "tmp/" in proc.stdout
    assert CONFIG_GROUPS_TITLE in lines
    assert any(line.startswith("model: qwen3_") for line in lines)  # Hydra's $APP_CONFIG_GROUPS
    assert f"python -m gpu_simulate_test.cli.{stage} --cfg job" in proc.stdout
    assert "--hydra-help" in proc.stdout
    # no $CONFIG: no top-level key of the composed config on a line of its own
    assert not [line for line in lines if re.fullmatch(r"[a-z_]+:", line)]
    assert "progress: true" not in lines
    assert "Powered by Hydra" not in proc.stdout


def _shown(value: str) -> Any:
    """A value as the help shows it, read as YAML (``null``, ``4.0``, ``[1,2]``)."""
    got = OmegaConf.select(OmegaConf.create(f"v: {value}"), "v")
    return OmegaConf.to_container(got) if isinstance(got, DictConfig | ListConfig) else got


def _mismatch(cfg: DictConfig, item: Knob) -> str | None:
    """What is wrong with one knob line against the composed config, or None."""
    if item.derived_from:
        absent = [
            s for s in item.derived_from if OmegaConf.select(cfg, s, default=ABSENT) is ABSENT
        ]
        return f"{item.name}: derived from {absent}, not in the config" if absent else None
    if item.required:
        parent, _, leaf = item.name.rpartition(".")  # is_missing reads one level, not a path
        node = OmegaConf.select(cfg, parent, default=None) if parent else cfg
        missing = isinstance(node, DictConfig) and OmegaConf.is_missing(node, leaf)
        return None if missing else f"{item.name} has a default"
    actual = OmegaConf.select(cfg, item.name, throw_on_missing=True, default=ABSENT)
    if actual is ABSENT:
        return f"{item.name} is not in the config"
    if isinstance(actual, DictConfig | ListConfig):
        actual = OmegaConf.to_container(actual)
    if actual == _shown(item.value) or str(actual) == item.value:
        return None
    return f"{item.name}: the help says {item.value}, the config holds {actual!r}"


@pytest.mark.parametrize("stage", STAGES)
def test_defaults_shown_are_the_ones_that_run(compose_stage: Any, stage: str) -> None:
    """Every main knob's value is the composed config's default; a required one is unset
    (``???``); a derived one is not compared (the run sets it) but names the keys it comes
    from, each in the config."""
    cfg = compose_stage(stage)
    assert [m for item in STAGE_HELP[stage].knobs if (m := _mismatch(cfg, item))] == []


def test_a_wrong_knob_line_is_a_mismatch() -> None:
    """The check above can fail: a wrong default, an absent key, a required key with a default
    and a derived one from an absent key are each named; the right lines are not."""
    cfg = OmegaConf.create({"workload": {"qps": 2.0, "seed": "???"}, "output": {"run_id": None}})
    assert _mismatch(cfg, knob("workload.qps", "2.0", "")) is None
    assert _mismatch(cfg, knob("output.run_id", "null", "")) is None
    assert _mismatch(cfg, required("workload.seed", "")) is None
    assert _mismatch(cfg, knob("workload.qps", "4.0", "")) == (
        "workload.qps: the help says 4.0, the config holds 2.0"
    )
    assert _mismatch(cfg, knob("workload.rate", "2.0", "")) == "workload.rate is not in the config"
    assert _mismatch(cfg, required("workload.qps", "")) == "workload.qps has a default"
    assert _mismatch(cfg, derived("workload.n", ("workload.qps", "x.y"), "")) == (
        "workload.n: derived from ['x.y'], not in the config"
    )


@pytest.mark.parametrize("stage", STAGES)
def test_groups_shown_are_the_stages_defaults(stage: str) -> None:
    """The groups a page says the stage picks are its primary config's defaults list."""
    primary = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / f"{stage}.yaml"))
    assert isinstance(primary, dict)
    defaults = primary["defaults"]
    picked = [
        (group, option)
        for entry in defaults
        if isinstance(entry, dict)
        for group, option in entry.items()
        if not group.startswith("override ")
    ]
    assert tuple(picked) == STAGE_HELP[stage].groups
    assert {"override hydra/help": stage} in defaults


def test_the_groups_a_stage_does_not_take_are_said() -> None:
    """Hydra lists every group under the stage's own; those outside its defaults list are
    refused as ``group=option``, and the page says which they are."""
    groups = {p.name for p in CONFIG_DIR.iterdir() if p.is_dir()} - {"experiment"}
    assert set(CONFIG_GROUPS) == groups
    said = help_template("deep_profile", STAGE_HELP["deep_profile"])
    assert "Not taken by deep_profile: backend, workload" in said
    assert "Not taken by" not in help_template("pipeline", STAGE_HELP["pipeline"])


def test_every_preset_is_on_one_page_and_every_docs_page_exists() -> None:
    presets = [p for page in STAGE_HELP.values() for p in page.presets]
    assert sorted(presets) == sorted(p.stem for p in (CONFIG_DIR / "experiment").glob("*.yaml"))
    for stage, page in STAGE_HELP.items():
        assert (REPO / (page.docs or f"docs/{stage}.md")).is_file(), stage


def test_help_node_is_hydras_help_and_refuses_what_would_break_it() -> None:
    """The node has Hydra's HelpConf keys; its template takes Hydra's groups, never the config
    dump; a ``$`` (Hydra reads it as a template variable) or non-ASCII text is refused."""
    page = STAGE_HELP["pipeline"]
    node = help_node("pipeline", page)
    assert set(node) == {"app_name", "header", "footer", "template"}
    assert "$APP_CONFIG_GROUPS" in node["template"]
    assert "$CONFIG" not in node["template"].replace("$APP_CONFIG_GROUPS", "")
    for bad in ("costs $5", "arrow \u2192"):
        broken = StageHelp(
            purpose=(bad,), examples=page.examples, outputs=page.outputs, knobs=page.knobs
        )
        with pytest.raises(ValueError, match="pipeline"):
            help_node("pipeline", broken)
    assert knob("a.b", "1", "x").label == "a.b=1"
