"""The stage schemas, where the shipped YAML lives, and composed configs into dataclasses.

No Hydra here: the CLI layer registers :data:`STAGE_SCHEMAS` with Hydra's ConfigStore
(:func:`gpu_simulate_test.cli.registry.register_configs`); the library only needs OmegaConf to
validate a composed or stored config (:func:`to_typed`).

A ``backend`` node composes as :data:`~gpu_simulate_test.config.backends.BackendKnobs` (every
engine's knobs, unset until given) and is typed as its engine's own class here, so a knob of
another engine is refused by name. A ``workload`` node composes as the keys its group and the
overrides give (:func:`composable_schema`), and is typed here with every default filled: a
job's config (``--cfg job``) shows the workload as given, its run records it whole
(:func:`to_resolved`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from gpu_simulate_test.config.backends import (
    BackendConfig,
    BackendKnobs,
    backend_config,
)
from gpu_simulate_test.config.bench_import import BenchImportStageConfig
from gpu_simulate_test.config.capacity import CapacityStageConfig
from gpu_simulate_test.config.compare import CompareStageConfig
from gpu_simulate_test.config.deep_profile import DeepProfileStageConfig
from gpu_simulate_test.config.fidelity import FidelityStageConfig
from gpu_simulate_test.config.pipeline import PipelineStageConfig
from gpu_simulate_test.config.real_bench import RealBenchStageConfig
from gpu_simulate_test.config.schema import ConfigError, WorkloadConfig, WorkloadStageConfig
from gpu_simulate_test.config.tune import TuneStageConfig
from gpu_simulate_test.config.vidur import VidurProfileStageConfig, VidurSimulateStageConfig

T = TypeVar("T")

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
"""The YAML config groups, shipped inside the package (``gpu_simulate_test/configs/``, package
data of the wheel), so a stage runs from any directory of any install."""

STAGE_SCHEMAS: Mapping[str, type] = MappingProxyType(
    {
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
        "tune": TuneStageConfig,
    }
)
"""Primary config name → the dataclass its composed config must satisfy."""


def writable_schema(schema: type) -> DictConfig:
    """The structured (type-checked) config of a frozen dataclass, left writable.

    Frozen dataclasses make Hydra's nodes read-only, which forbids merging YAML groups and
    command-line overrides into them; the typed check still happens on every assignment, and
    :func:`to_typed` re-creates the frozen dataclass at the end. Each ``backend`` node takes
    every engine's knobs (and every ``server.*`` knob), unset, its ``name`` the field's default
    engine.
    """
    node = OmegaConf.structured(schema)
    _clear_readonly(node)
    for parent, key in _backend_nodes(node):
        knobs = OmegaConf.structured(BackendKnobs)
        OmegaConf.set_readonly(knobs, False)
        knobs.name = parent[key].name
        parent[key] = knobs
    _clear_readonly(node)
    return node


def composable_schema(schema: type) -> DictConfig:
    """What Hydra composes a stage's config into (``<stage>_schema``): :func:`writable_schema`,
    its ``workload`` an open mapping of the keys given (the workload group's, the stage's, the
    overrides'), not every field with its default; :func:`to_typed` checks each key and fills
    the defaults. Any workload key may be overridden (``workload.session.enabled=true`` where
    the group named none); an unknown one is refused by :func:`to_typed`, naming it."""
    node = writable_schema(schema)
    if not any(f.name == "workload" and _is_workload(f.type) for f in dataclasses.fields(schema)):
        return node
    root = OmegaConf.create({})
    for key in node:
        root[key] = {} if key == "workload" else node._get_node(key)
    OmegaConf.set_struct(root.workload, False)
    return root


def _is_workload(annotation: Any) -> bool:
    return annotation in (WorkloadConfig, "WorkloadConfig")


def _clear_readonly(node: DictConfig) -> None:
    OmegaConf.set_readonly(node, False)
    for key in node:
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _clear_readonly(child)


def _backend_nodes(node: DictConfig) -> list[tuple[DictConfig, str]]:
    """(parent, key) of every node typed as a backend config, depth first."""
    found = []
    for key in node:
        child = node._get_node(key)
        if not isinstance(child, DictConfig) or child._is_missing() or child._is_none():
            continue
        ref = child._metadata.ref_type
        if isinstance(ref, type) and issubclass(ref, BackendConfig):
            found.append((node, str(key)))
        else:
            found += _backend_nodes(child)
    return found


def _typed_backend(knobs: DictConfig, where: str) -> DictConfig:
    """The engine config a composed ``backend`` node names, built from the knobs set in it."""
    values = OmegaConf.to_container(knobs, resolve=True, throw_on_missing=False)
    assert isinstance(values, dict)
    given = _given(values)
    try:
        typed = backend_config(**given)
    except ConfigError as exc:
        raise ConfigError(str(exc).replace("backend.", f"{where}.")) from exc
    node = OmegaConf.structured(typed)
    OmegaConf.set_readonly(node, False)
    return node


def _given(values: dict[Any, Any]) -> dict[str, Any]:
    """The knobs set in a backend node's values, ``server`` as the subknobs set in it (left
    out when none is)."""
    given: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict) and key == "server":
            value = _given(value)
            if not value:
                continue
        if value != MISSING:
            given[str(key)] = value
    return given


def to_typed(cfg: DictConfig, schema: type[T]) -> T:
    """Validate a composed config against ``schema`` and return the frozen dataclass.

    Raises ConfigError naming the offending key for unknown keys, wrong types, range checks
    and a knob given to an engine that has no such knob.
    """
    try:
        # as plain values: a node typed as one engine's class merges as its knobs
        plain = OmegaConf.to_container(cfg, resolve=False)
        merged = OmegaConf.merge(writable_schema(schema), plain)
        assert isinstance(merged, DictConfig)
        for parent, key in _backend_nodes(merged):
            parent[key] = _typed_backend(parent[key], str(parent._get_full_key(key)))
        obj: Any = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"invalid config: {exc}") from exc
    except ConfigError as exc:
        raise ConfigError(f"invalid config: {exc}") from exc
    if not isinstance(obj, schema):
        raise ConfigError(f"config did not produce a {schema.__name__}")
    return obj


def to_resolved(cfg: DictConfig, typed: Any) -> dict[str, Any]:
    """``cfg`` resolved, as a run records it (``run_meta.json`` ``config``), each backend and
    workload as ``typed`` (from :func:`to_typed`) holds it: a backend its engine's knobs, none of
    another's; a workload every field (the given ones and the defaults)."""
    resolved = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=False)
    assert isinstance(resolved, dict)
    _put_typed(resolved, typed)
    return {str(k): v for k, v in resolved.items()}


def _put_typed(resolved: dict[Any, Any], typed: Any) -> None:
    """Replace each backend and workload in ``resolved`` by its values as ``typed`` holds
    them."""
    for f in dataclasses.fields(typed):
        value = getattr(typed, f.name)
        if isinstance(value, BackendConfig | WorkloadConfig):
            resolved[f.name] = OmegaConf.to_container(OmegaConf.structured(value))
        elif dataclasses.is_dataclass(value) and isinstance(resolved.get(f.name), dict):
            _put_typed(resolved[f.name], value)
