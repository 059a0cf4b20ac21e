"""Device and node SKUs for our hardware names (``cpu``, ``h200``, ...), from HardwareConfig.

Vidur looks a device up with ``BaseDeviceSKUConfig.create_from_type_string(name)``: the first
subclass whose ``str(get_type())`` equals ``name``. Its ``DeviceSKUType`` enum cannot be extended,
but ``get_type()`` may return a plain string. Vidur's own ``a100``/``h100`` are used as they are
(they come first in the subclass walk); every other name gets a generated SKU with this
hardware's memory and bf16 peak. A node SKU ``<device>_node`` with one device goes with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any

from vidur.config.device_sku_config import BaseDeviceSKUConfig
from vidur.config.node_sku_config import BaseNodeSKUConfig
from vidur.config.utils import get_all_subclasses

from gpu_simulate_test.config.schema import HardwareConfig
from gpu_simulate_test.io.artifacts import stable_id

VIDUR_NODE_FOR_BUILTIN: Mapping[str, str] = MappingProxyType(
    {
        "a100": "a100_pairwise_nvlink",
        "h100": "h100_pairwise_nvlink",
    }
)
"""Vidur's node SKU for its own device SKUs (TP=PP=1 only needs a valid one)."""


@dataclass(frozen=True)
class DeviceChoice:
    """What the replica config is given, and the numbers Vidur will see."""

    device: str
    network_device: str
    total_memory_gb: float
    fp16_tflops: float
    builtin: bool


def _find(base: type, type_string: str, *, ours: bool = False) -> Any:
    """The first subclass of ``base`` (Vidur's walk) named ``type_string``; with ``ours``, only
    one generated here."""
    for cls in get_all_subclasses(base):
        if str(cls.get_type()) == type_string and (not ours or cls.__module__ == __name__):
            return cls
    return None


def _make(base: type, class_name: str, type_string: str, defaults: dict[str, Any]) -> type:
    def get_type() -> str:
        return type_string

    return dataclasses.make_dataclass(
        class_name,
        [(k, type(v), dataclasses.field(default=v)) for k, v in defaults.items()],
        bases=(base,),
        namespace={"get_type": staticmethod(get_type), "__module__": __name__},
    )


def register_device(hardware: HardwareConfig) -> DeviceChoice:
    """Make ``hardware`` known to Vidur (idempotent) and return the SKU names to use."""
    builtin = _find(BaseDeviceSKUConfig, hardware.name)
    if builtin is not None and hardware.name in VIDUR_NODE_FOR_BUILTIN:
        sku = builtin()
        return DeviceChoice(
            hardware.name,
            VIDUR_NODE_FOR_BUILTIN[hardware.name],
            float(sku.total_memory_gb),
            float(sku.fp16_tflops),
            True,
        )
    memory, tflops = float(hardware.memory_gib), float(hardware.peak_bf16_tflops)
    device = hardware.name
    existing = _find(BaseDeviceSKUConfig, device, ours=True)
    if existing is not None:
        sku = existing()
        if (sku.total_memory_gb, sku.fp16_tflops) != (memory, tflops):
            # same name, other numbers (an override): a distinct, deterministic SKU name
            device = f"{hardware.name}-{stable_id([memory, tflops], length=8)}"
    _generated_skus(device, memory, tflops)
    return DeviceChoice(device, f"{device}_node", memory, tflops, False)


@cache
def _generated_skus(device: str, memory: float, tflops: float) -> tuple[type, type]:
    """The device SKU ``device`` and its one-device node SKU, made once per name and numbers.

    Vidur finds them by subclass walk, and ``__subclasses__`` holds classes weakly: this cache is
    what keeps them alive (no module-level registry).
    """
    suffix = "".join(c if c.isalnum() else "_" for c in device)
    device_cls = _make(
        BaseDeviceSKUConfig,
        f"DeviceSKU_{suffix}",
        device,
        {"fp16_tflops": tflops, "total_memory_gb": memory},
    )
    node_cls = _make(
        BaseNodeSKUConfig,
        f"NodeSKU_{suffix}",
        f"{device}_node",
        {"device_sku_type": device, "num_devices_per_node": 1},
    )
    return device_cls, node_cls
