"""The stage schemas, where the shipped YAML lives, and composed configs into dataclasses.

No Hydra here: the CLI layer registers :data:`STAGE_SCHEMAS` with Hydra's ConfigStore
(:func:`gpu_simulate_test.cli.registry.register_configs`); the library only needs OmegaConf to
validate a composed or stored config (:func:`to_typed`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gpu_simulate_test.config.bench_import import BenchImportStageConfig
from gpu_simulate_test.config.capacity import CapacityStageConfig
from gpu_simulate_test.config.compare import CompareStageConfig
from gpu_simulate_test.config.deep_profile import DeepProfileStageConfig
from gpu_simulate_test.config.fidelity import FidelityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.schema import ConfigError, WorkloadStageConfig
from gpu_simulate_test.config.vidur import VidurProfileStageConfig, VidurSimulateStageConfig

T = TypeVar("T")

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
"""The YAML config groups, shipped inside the package (``gpu_simulate_test/configs/``, package
data of the wheel), so a stage runs from any directory of any install."""

STAGE_SCHEMAS: dict[str, type] = {
    "workload": WorkloadStageConfig,
    "vidur_profile": VidurProfileStageConfig,
    "vidur_simulate": VidurSimulateStageConfig,
    "real_bench": RealBenchStageConfig,
    "compare": CompareStageConfig,
    "pipeline": PipelineStageConfig,
    "deep_profile": DeepProfileStageConfig,
    "fidelity": FidelityStageConfig,
    "capacity": CapacityStageConfig,
    "bench_import": BenchImportStageConfig,
}
"""Primary config name → the dataclass its composed config must satisfy."""


def writable_schema(schema: type) -> DictConfig:
    """The structured (type-checked) config of a frozen dataclass, left writable.

    Frozen dataclasses make Hydra's nodes read-only, which forbids merging YAML groups and
    command-line overrides into them; the typed check still happens on every assignment, and
    :func:`to_typed` re-creates the frozen dataclass at the end.
    """
    node = OmegaConf.structured(schema)
    _clear_readonly(node)
    return node


def _clear_readonly(node: DictConfig) -> None:
    OmegaConf.set_readonly(node, False)
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _clear_readonly(child)


def to_typed(cfg: DictConfig, schema: type[T]) -> T:
    """Validate a composed config against ``schema`` and return the frozen dataclass.

    Raises ConfigError naming the offending key for unknown keys, wrong types and range checks.
    """
    try:
        merged = OmegaConf.merge(writable_schema(schema), cfg)
        obj: Any = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config: {exc}") from exc
    except ConfigError as exc:
        raise ConfigError(f"invalid config: {exc}") from exc
    if not isinstance(obj, schema):
        raise ConfigError(f"config did not produce a {schema.__name__}")
    return obj
