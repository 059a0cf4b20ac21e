"""GPU telemetry during a run: an NVML sampler thread (a no-op without NVML or a GPU)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

import pandas as pd

from gpu_simulate_test.real_bench.contract import TELEMETRY


def gpu_index(device: str) -> int | None:
    """torch's (CUDA's) index of a device string: ``cuda`` → 0, ``cuda:3`` → 3, ``cpu`` →
    None; NVML's may differ (:func:`nvml_device`)."""
    if not device.startswith("cuda"):
        return None
    _, _, index = device.partition(":")
    return int(index) if index else 0


def nvml_device(index: int, visible: str | None) -> int | str:
    """The NVML device of torch's GPU ``index``: NVML counts every GPU of the machine, torch
    only those ``CUDA_VISIBLE_DEVICES`` lists, in its order (``2,3``: torch's 0 is NVML's 2),
    by index or by UUID (``GPU-…``, ``MIG-…``: returned as the UUID)."""
    if visible is None or not visible.strip():
        return index
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if index >= len(entries):
        raise ValueError(
            f"cuda:{index} is not among the {len(entries)} GPU(s) CUDA_VISIBLE_DEVICES={visible} "
            "makes visible"
        )
    entry = entries[index]
    return int(entry) if entry.isdigit() else entry


def open_nvml(nv: Any, target: int | str) -> Any:
    """NVML's handle of ``target``: an index, or a GPU's UUID or a unique prefix of one (CUDA
    takes either; NVML's lookup only the whole UUID), else a MIG instance's UUID."""
    if isinstance(target, int):
        return nv.nvmlDeviceGetHandleByIndex(target)
    for i in range(nv.nvmlDeviceGetCount()):
        handle = nv.nvmlDeviceGetHandleByIndex(i)
        uuid = nv.nvmlDeviceGetUUID(handle)
        if (uuid.decode() if isinstance(uuid, bytes) else str(uuid)).startswith(target):
            return handle
    return nv.nvmlDeviceGetHandleByUUID(target)


class TelemetrySampler:
    """Samples clocks, power, memory and utilization every ``interval_s`` in a daemon thread."""

    def __init__(self, device: str, interval_s: float, origin: float = 0.0) -> None:
        self.index = gpu_index(device)
        self.interval_s = interval_s
        self.origin = origin
        self.samples: list[dict[str, Any]] = []
        self.available = False
        self.note = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml: Any = None
        self.nvml_index = self.index

    def start(self) -> None:
        if self.index is None:
            self.note = "no GPU device configured"
            return
        try:
            import pynvml
        except ImportError as exc:  # telemetry is optional
            self.note = f"NVML unavailable: {exc}"
            return
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        try:
            target = nvml_device(self.index, visible)
        except ValueError as exc:
            self.note = f"NVML not sampled: {exc}"
            return
        try:
            pynvml.nvmlInit()
            self._handle = open_nvml(pynvml, target)
        except pynvml.NVMLError as exc:  # no library, no driver, bad index or UUID
            self.note = f"NVML unavailable for device {target}: {exc}"
            return
        self._nvml = pynvml
        found = self._read(pynvml.nvmlDeviceGetIndex)  # the column's NVML index
        self.nvml_index = found if isinstance(found, int) else self.index
        said = (
            "" if visible is None else f" (cuda:{self.index} under CUDA_VISIBLE_DEVICES={visible})"
        )
        self.note = f"NVML device {target}{said}, NVML index {self.nvml_index}"
        if isinstance(target, str) and target.startswith("MIG-"):
            self.note += (
                "; a MIG instance: NVML may not report its clocks, power or utilization "
                "(those columns then empty)"
            )
        self.available = True
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _read(self, getter: Any, *args: Any) -> Any:
        try:
            return getter(self._handle, *args)
        except self._nvml.NVMLError:  # a counter this GPU does not expose
            return None

    def sample(self) -> dict[str, Any]:
        nv = self._nvml
        mem = self._read(nv.nvmlDeviceGetMemoryInfo)
        util = self._read(nv.nvmlDeviceGetUtilizationRates)
        power_mw = self._read(nv.nvmlDeviceGetPowerUsage)
        return {
            "time_s": time.perf_counter() - self.origin,
            "gpu_index": self.nvml_index,
            "sm_clock_mhz": self._read(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_SM),
            "mem_clock_mhz": self._read(nv.nvmlDeviceGetClockInfo, nv.NVML_CLOCK_MEM),
            "power_w": None if power_mw is None else power_mw / 1000.0,
            "memory_used_bytes": None if mem is None else mem.used,
            "gpu_util_pct": None if util is None else util.gpu,
            "mem_util_pct": None if util is None else util.memory,
            "temperature_c": self._read(nv.nvmlDeviceGetTemperature, nv.NVML_TEMPERATURE_GPU),
        }

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._nvml is not None:
            with contextlib.suppress(self._nvml.NVMLError):  # already shut down
                self._nvml.nvmlShutdown()
            self._nvml = None

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.samples, columns=TELEMETRY.column_names)
