"""The shipped config-group files as typed configs, for code that runs without Hydra.

``gpu_simulate_test/configs/model/<name>.yaml`` (package data) is the one place a model's
architecture numbers live; benchmarks, tests and the Vidur model registration read them through
:func:`model_preset`.
"""

from __future__ import annotations

from functools import cache
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from gpu_simulate_test.config.registry import CONFIG_DIR, to_typed
from gpu_simulate_test.config.schema import ConfigError, HardwareConfig, ModelConfig

T = TypeVar("T")


def preset_names(group: str) -> list[str]:
    """The options of a config group (``model``, ``hardware``, ...), sorted."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


def load_preset(group: str, name: str, schema: type[T]) -> T:
    """``gpu_simulate_test/configs/<group>/<name>.yaml`` validated against ``schema``."""
    path = CONFIG_DIR / group / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(
            f"{group}={name}: no such option (choices: {', '.join(preset_names(group))})"
        )
    node = OmegaConf.load(path)
    if not isinstance(node, DictConfig):
        raise ConfigError(f"{path}: expected a mapping")
    return to_typed(node, schema)


@cache
def model_preset(name: str) -> ModelConfig:
    return load_preset("model", name, ModelConfig)


@cache
def hardware_preset(name: str) -> HardwareConfig:
    return load_preset("hardware", name, HardwareConfig)


def pipeline_workload() -> list[str]:
    """``make run``'s own workload (``configs/pipeline.yaml``'s ``workload`` block) as overrides
    of the workload stage (nested blocks as dotted keys), so that a benchmark replaying it cannot
    drift from it."""
    pipeline = OmegaConf.to_container(OmegaConf.load(CONFIG_DIR / "pipeline.yaml"))
    assert isinstance(pipeline, dict)

    def flat(prefix: str, value: Any) -> list[str]:
        if isinstance(value, dict):
            return [o for k, v in value.items() for o in flat(f"{prefix}.{k}", v)]
        return [f"{prefix}={value}"]

    return flat("workload", pipeline["workload"])
