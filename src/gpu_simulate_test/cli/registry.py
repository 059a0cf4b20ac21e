"""Hydra's side of the typed configs: every stage schema in the ConfigStore (``<stage>_schema``,
which each primary config lists in its defaults) and every stage's ``--help`` page
(``hydra/help/<stage>``, which each primary config overrides ``hydra/help`` with). Only the CLI
layer, tests and scripts that compose configs with Hydra call it; the library never imports
Hydra."""

from __future__ import annotations

from hydra.core.config_store import ConfigStore

from gpu_simulate_test.cli.help_pages import STAGE_HELP
from gpu_simulate_test.cli.help_text import help_node
from gpu_simulate_test.config.registry import CONFIG_DIR, STAGE_SCHEMAS, composable_schema

__all__ = ("CONFIG_DIR", "register_configs")


def register_configs() -> None:
    """Register every stage schema and every stage's help page with Hydra's ConfigStore
    (idempotent)."""
    cs = ConfigStore.instance()
    for stage, schema in STAGE_SCHEMAS.items():
        cs.store(name=f"{stage}_schema", node=composable_schema(schema))
    for stage, page in STAGE_HELP.items():
        cs.store(group="hydra/help", name=stage, node=help_node(stage, page))
