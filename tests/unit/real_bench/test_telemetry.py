"""The NVML sampler catches NVML's own errors only: a missing counter, no driver, a second
shutdown; anything else is a bug and surfaces."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

import pytest

from gpu_simulate_test.real_bench.telemetry import TelemetrySampler


class NVMLError(Exception):
    pass


def fake_nvml(**overrides: Callable[..., Any]) -> types.ModuleType:
    """A stand-in ``pynvml`` whose every reading works unless ``overrides`` says otherwise."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError  # type: ignore[attr-defined]
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_TEMPERATURE_GPU = 0, 1, 0  # type: ignore[attr-defined]
    values: dict[str, Callable[..., Any]] = {
        "nvmlInit": lambda: None,
        "nvmlShutdown": lambda: None,
        "nvmlDeviceGetHandleByIndex": lambda index: f"gpu{index}",
        "nvmlDeviceGetIndex": lambda h: int(h.removeprefix("gpu")),
        "nvmlDeviceGetMemoryInfo": lambda h: types.SimpleNamespace(used=1),
        "nvmlDeviceGetUtilizationRates": lambda h: types.SimpleNamespace(gpu=50, memory=20),
        "nvmlDeviceGetPowerUsage": lambda h: 100_000,
        "nvmlDeviceGetClockInfo": lambda h, kind: 1000,
        "nvmlDeviceGetTemperature": lambda h, kind: 40,
    }
    values.update(overrides)
    for name, fn in values.items():
        setattr(nv, name, fn)
    return nv


def _raise(exc: BaseException) -> Callable[..., Any]:
    def fn(*_args: Any) -> Any:
        raise exc

    return fn


def test_a_counter_the_gpu_lacks_reads_as_none(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = fake_nvml(nvmlDeviceGetPowerUsage=_raise(NVMLError("not supported")))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = TelemetrySampler("cuda:1", interval_s=10.0)
    sampler.start()
    sampler.stop()
    assert sampler.available and sampler.samples
    assert sampler.samples[0]["power_w"] is None and sampler.samples[0]["sm_clock_mhz"] == 1000


def test_an_nvml_failure_at_start_or_shutdown_is_not_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(nvmlInit=_raise(NVMLError("no driver"))))
    absent = TelemetrySampler("cuda", interval_s=10.0)
    absent.start()
    assert not absent.available and "no driver" in absent.note
    nv = fake_nvml(nvmlShutdown=_raise(NVMLError("uninitialized")))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = TelemetrySampler("cuda", interval_s=10.0)
    sampler.start()
    sampler.stop()  # NVML already shut down: said nothing
    assert sampler.available


def test_any_other_failure_at_shutdown_surfaces(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = fake_nvml(nvmlShutdown=_raise(RuntimeError("a bug")))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    sampler = TelemetrySampler("cuda", interval_s=10.0)
    sampler.start()
    with pytest.raises(RuntimeError, match="a bug"):
        sampler.stop()


UUIDS = ("GPU-0a11aaaa-0000", "GPU-1b22bbbb-1111", "GPU-5e1f0000-2222", "GPU-77aa0000-3333")


@pytest.mark.parametrize(
    ("device", "visible", "expected"),
    [("cuda", None, 0),
     ("cuda:1", "2,3", 3),
     ("cuda", "GPU-5e1f,GPU-77aa", 2),  # CUDA takes a unique prefix of a UUID
     ("cuda:1", "GPU-5e1f0000-2222,GPU-77aa0000-3333", 3),
     ("cuda:2", "0,1", None)],
)  # fmt: skip
def test_the_gpu_sampled_is_torchs_under_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, device: str, visible: str | None, expected: int | None
) -> None:
    """NVML counts every GPU of the machine, torch only the visible ones: with
    CUDA_VISIBLE_DEVICES=2,3 the run on ``cuda`` (NVML's GPU 2) sampled NVML's GPU 0, another
    job's; the samples' ``gpu_index`` is the NVML index sampled."""
    nv = fake_nvml(
        nvmlDeviceGetCount=lambda: len(UUIDS),
        nvmlDeviceGetHandleByIndex=lambda index: ("gpu", index),
        nvmlDeviceGetUUID=lambda h: UUIDS[h[1]].encode(),  # bytes, as older pynvml gives
        nvmlDeviceGetIndex=lambda h: h[1],
        nvmlDeviceGetHandleByUUID=_raise(NVMLError("not found")),  # whole UUIDs only
    )
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    sampler = TelemetrySampler(device, interval_s=10.0)
    sampler.start()
    sampler.stop()
    if expected is None:  # not visible: said, nothing sampled
        assert not sampler.available and "CUDA_VISIBLE_DEVICES=0,1" in sampler.note
    else:
        assert sampler.available and sampler.samples[0]["gpu_index"] == expected
        assert f"NVML index {expected}" in sampler.note


def test_a_mig_instance_is_sampled_by_its_uuid_and_said(monkeypatch: pytest.MonkeyPatch) -> None:
    nv = fake_nvml(
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetUUID=lambda h: "GPU-0a11aaaa-0000",
        nvmlDeviceGetHandleByUUID=lambda uuid: ("mig", uuid),
        nvmlDeviceGetIndex=_raise(NVMLError("not supported")),
    )
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-9c3d")
    sampler = TelemetrySampler("cuda", interval_s=10.0)
    sampler.start()
    sampler.stop()
    assert sampler.available and "a MIG instance" in sampler.note
    assert sampler.samples[0]["gpu_index"] == 0  # NVML gives none: torch's
