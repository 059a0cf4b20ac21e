"""A batching engine's knobs renamed to vLLM's own names (one name per knob): the old name is
refused where a user gives it, with the new one in the message, and read under the new name in a
record made before the rename (``run_meta.json`` ``config.backend``, a bundle's calibration
settings)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from gpu_simulate_test.config.schema import ConfigError

RENAMED_KNOBS: Mapping[str, str] = MappingProxyType(
    {
        "max_batch_tokens": "max_num_batched_tokens",
        "max_requests_per_batch": "max_num_seqs",
        "num_blocks": "num_gpu_blocks_override",
    }
)
"""A batching engine's knobs by their old names, each with vLLM's own name it now has: refused
when given (:func:`backend_config`), read under the new name in a record (:func:`own_knobs`)."""


def check_renamed(knobs: Mapping[str, Any], prefix: str = "backend") -> None:
    """ConfigError naming each knob in ``knobs`` given by its old name, with its new one."""
    old = [k for k in knobs if k in RENAMED_KNOBS]
    if old:
        raise ConfigError(
            "; ".join(f"{prefix}.{k} is now {prefix}.{RENAMED_KNOBS[k]}" for k in old)
            + " (vLLM's own names, one name per knob)"
        )


def current_names(recorded: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded backend config with each knob under its name today (:data:`RENAMED_KNOBS`:
    records made before vLLM's names hold the old ones)."""
    return {RENAMED_KNOBS.get(k, k): v for k, v in recorded.items()}
