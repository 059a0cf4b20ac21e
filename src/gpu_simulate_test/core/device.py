"""The device a profile runs on: check it exists before anything is written, and describe it."""

from __future__ import annotations

from typing import Any

from gpu_simulate_test.config.schema import ConfigError, HardwareConfig
from gpu_simulate_test.io.runs import cpu_name, gpu_info


class DeviceUnavailableError(ConfigError):
    """The configured hardware is not on this machine; the message says what was found."""


def check_device(hardware: HardwareConfig) -> str:
    """Return the torch device string for ``hardware``, or fail naming what this machine has."""
    device = hardware.device
    if not device.startswith("cuda"):
        return device
    import torch  # only here: a CPU run refused for other reasons need not pay for the import

    found = f"torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}"
    if not torch.cuda.is_available():
        raise DeviceUnavailableError(
            f"hardware={hardware.name} needs a CUDA device ({device}) but found no CUDA device "
            f"({found}); profile on a GPU machine or pass hardware=cpu"
        )
    index = torch.device(device).index or 0
    count = torch.cuda.device_count()
    if index >= count:
        raise DeviceUnavailableError(
            f"hardware.device={device} but only {count} CUDA device(s) are visible ({found})"
        )
    return f"cuda:{index}"


def describe_device(device: str) -> dict[str, Any]:
    """``device_name`` and ``driver`` (NVML) of ``device``, for the bundle's meta.json."""
    import torch

    if not device.startswith("cuda"):
        return {
            "device_name": cpu_name(),
            "driver": None,
            "torch_num_threads": torch.get_num_threads(),
        }
    index = torch.device(device).index or 0
    gpus = gpu_info()
    driver = gpus[0]["driver"] if gpus else None
    return {
        "device_name": torch.cuda.get_device_name(index),
        "driver": driver,
        "cuda_version": torch.version.cuda,
        "gpu": next((g for g in gpus if g["index"] == index), None),
    }
