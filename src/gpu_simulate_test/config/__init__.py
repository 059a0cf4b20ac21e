"""Typed configs, their Hydra registration and composition helpers."""

from gpu_simulate_test.config.schema import (
    ArrivalConfig,
    ConfigError,
    HardwareConfig,
    LengthDistConfig,
    ModelConfig,
    OutputConfig,
    ProfilingConfig,
    WorkloadConfig,
    WorkloadStageConfig,
)

__all__ = (
    "ArrivalConfig",
    "ConfigError",
    "HardwareConfig",
    "LengthDistConfig",
    "ModelConfig",
    "OutputConfig",
    "ProfilingConfig",
    "WorkloadConfig",
    "WorkloadStageConfig",
)
