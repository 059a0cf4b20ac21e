"""The host's memory speed, read the way a decode step reads it: one LM head's bytes, on the
engine's core. Recorded beside every run and calibration, not judged.

On the project's 2-core CPU machine a decode step of tiny Qwen3 is mostly its LM head: 151,936 ×
128 float32 weights, 78 MB, read once per step. The host's last-level cache (300 MB) is shared
with other tenants. The same workload on the same server, back to back, took 6.4 to 9.9 ms per
decode of one request across five runs, and this probe read 2.8 ms before the slowest run and
8.7 ms after it (``benchmarks/results/host_memory_20261127``). Nothing in this machine's own
process table shows such a tenant.

:func:`measure` times that read, a matrix-vector product over a buffer of the LM head's bytes in
one thread pinned to one core, for :data:`PROBE_S`, and reports the median read. ``real_bench``
reads it before its clock starts and after its last request (``run_meta.json``: ``host_probe``),
the engine calibration before its experiments and after its replays (the bundle's
``engine_calibration``), and ``compare`` sets the truth's reading against the calibration's
(:func:`drift`, ``comparison.json`` ``host_memory``; the fidelity report shows it per load).

It is not a disturbance sign. Over 21 runs (a bursty fidelity campaign's 16 and the five above)
five had a reading 1.5 times or more off the run's other one (a tenant's sweeps last seconds, a
reading 0.3 s), and only one of those five was the slowest of its load; the load whose truth
read 1.87 times its calibration's had its simulated steps within 0.1% of the engine's.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

PROBE_S = 0.3
"""How long one reading lasts (the median of the reads within it)."""
BYTES_PER_ELEMENT: Mapping[str, int] = MappingProxyType({"float32": 4, "bfloat16": 2, "float16": 2})


def lm_head_bytes(vocab_size: int, hidden_size: int, dtype: str) -> int:
    """Bytes of one LM head (``vocab_size`` × ``hidden_size`` in ``dtype``; 4 per element
    for a dtype not listed)."""
    return int(vocab_size) * int(hidden_size) * BYTES_PER_ELEMENT.get(dtype, 4)


def probe_cpu(client_cpus: set[int] | None) -> int:
    """The core to read on: the first of this process's cores the client does not hold (the
    engine's), else its last."""
    cpus = sorted(os.sched_getaffinity(0))
    rest = [c for c in cpus if c not in (client_cpus or set())]
    return rest[0] if rest else cpus[-1]


@contextlib.contextmanager
def _one_thread_on(cpu: int) -> Iterator[None]:
    """The calling thread on ``cpu``, torch on one thread; both restored after."""
    import torch

    threads = torch.get_num_threads()
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpu})
        torch.set_num_threads(1)
        yield
    finally:
        torch.set_num_threads(threads)
        os.sched_setaffinity(0, before)


def measure(nbytes: int, hidden_size: int, cpu: int, duration_s: float = PROBE_S) -> dict[str, Any]:
    """One reading: the median time to read ``nbytes`` (float32 rows of ``hidden_size``) as a
    matrix-vector product, on ``cpu``, over ``duration_s`` (after two reads that load it)."""
    import torch

    rows = max(1, nbytes // (4 * hidden_size))
    with _one_thread_on(cpu):
        weights = torch.ones(rows, hidden_size)
        x = torch.ones(hidden_size)
        for _ in range(2):
            torch.mv(weights, x)
        times: list[float] = []
        end = time.perf_counter() + duration_s
        while not times or time.perf_counter() < end:
            start = time.perf_counter()
            torch.mv(weights, x)
            times.append(time.perf_counter() - start)
    ms = statistics.median(times) * 1e3
    mbytes = rows * hidden_size * 4 / 1e6
    return {
        "ms": round(ms, 4),
        "reads": len(times),
        "mbytes": round(mbytes, 3),
        "gb_s": round(mbytes / ms, 3),
        "cpu": cpu,
    }


def reads_host(device: str, enabled: bool) -> bool:
    """Whether a run on ``device`` reads the probe: on CPU, with ``backend.host_probe`` on (a
    GPU run's steps read the GPU's memory, not the host's)."""
    return enabled and device == "cpu"


def read(
    vocab_size: int, hidden_size: int, dtype: str, client_cpus: set[int] | None
) -> dict[str, Any]:
    """One reading for a CPU run of a model (``dtype`` auto: float32, as on CPU)."""
    nbytes = lm_head_bytes(vocab_size, hidden_size, "float32" if dtype == "auto" else dtype)
    return measure(nbytes, hidden_size, probe_cpu(client_cpus))


def run_reading(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> float | None:
    """A run's reading: the mean of its readings before and after (None without both)."""
    if not before or not after:
        return None
    return (float(before["ms"]) + float(after["ms"])) / 2.0


def calibration_reading(probe: Mapping[str, Any]) -> dict[str, Any] | None:
    """An engine calibration's reading: before its experiments, after its replays under load,
    and their mean (``ms``, what a real run's reading is set against); None when not read."""
    ms = run_reading(probe.get("before"), probe.get("after"))
    if ms is None:
        return None
    return {**probe, "ms": round(ms, 4), "mbytes": probe["before"]["mbytes"]}


def drift(
    calibration: Mapping[str, Any] | None, real: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The truth's reading (``real``: a run's ``host_probe``) over the calibration's (a
    bundle's ``host_probe``); None unless both were read, of the same bytes."""
    if not calibration or not real:
        return None
    ms = run_reading(real.get("before"), real.get("after"))
    if ms is None or not calibration.get("ms"):
        return None
    if not math.isclose(float(calibration["mbytes"]), float(real["before"]["mbytes"])):
        return None
    return {
        "calibration_ms": float(calibration["ms"]),
        "real_ms": round(ms, 4),
        "ratio": round(ms / float(calibration["ms"]), 4),
        "mbytes": float(calibration["mbytes"]),
    }


def line(d: Mapping[str, Any]) -> str:
    """One sentence on a :func:`drift`."""
    ratio = float(d["ratio"])
    if f"{ratio:.2f}" == "1.00":
        way = "the same"
    else:
        way = ("slower" if ratio > 1 else "faster") + " at the truth"
    return (
        f"host memory: the truth read {d['mbytes']:.3g} MB (one LM head) in {d['real_ms']:.3g} ms, "
        f"the calibration in {d['calibration_ms']:.3g} ms ({ratio:.2f}×, {way})"
    )
