"""argv lists (never a shell string) for ``nsys profile``, ``nsys stats`` and ``ncu``.

Flag spellings follow the Nsight Systems user guide and the Nsight Compute CLI guide:
``--capture-range=nvtx --nvtx-capture=<range[@domain]>`` gates an nsys capture on an NVTX range;
Python NVTX strings are not registered strings, so nsys only sees them with
``NSYS_NVTX_PROFILER_REGISTER_ONLY=0`` in the application's environment (passed with
``--env-var``). ncu's ``--nvtx-include`` needs a trailing ``/`` to match push/pop ranges
(without it the expression matches start/end ranges).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Literal

NVTX_REGISTER_ENV: Mapping[str, str] = MappingProxyType({"NSYS_NVTX_PROFILER_REGISTER_ONLY": "0"})
"""Environment that lets nsys match NVTX ranges named by unregistered (Python) strings."""

NSYS_STATS_REPORTS: tuple[str, ...] = ("cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_sum")
KERNEL_NAME_BASES: tuple[str, ...] = ("function", "demangled", "mangled")
"""``ncu --kernel-name-base`` choices: what ``--kernel-name`` is matched against."""
CaptureRange = Literal["none", "nvtx", "cudaProfilerApi"]
NcuPage = Literal["details", "raw"]
_CAPTURE_END = re.compile(r"^(none|stop|stop-shutdown|repeat(\[?:\d+\]?)?|repeat-shutdown:\d+)$")


def nsys_profile_argv(
    app_argv: Sequence[str],
    output: str | Path,
    *,
    nsys: str = "nsys",
    trace: Sequence[str] = ("cuda", "nvtx", "osrt"),
    capture_range: CaptureRange = "none",
    nvtx_capture: str | None = None,
    capture_range_end: str | None = None,
    sample: str | None = "none",
    cpuctxsw: str | None = "none",
    cuda_graph_trace: str | None = None,
    force_overwrite: bool = True,
    extra: Sequence[str] = (),
) -> list[str]:
    """``nsys profile`` of ``app_argv`` writing ``<output>.nsys-rep``.

    With ``capture_range="nvtx"``, ``nvtx_capture`` names the range (``range`` or
    ``range@domain``) and must not be empty; ``capture_range_end`` (``stop``, ``repeat[:N]``,
    ...) is passed only when set. ``sample``/``cpuctxsw`` None leave nsys's defaults.
    """
    if not app_argv:
        raise ValueError("nsys profile: app_argv is empty (nothing to profile)")
    if capture_range == "nvtx" and not (nvtx_capture or "").strip():
        raise ValueError("nsys profile: capture_range='nvtx' needs a non-empty nvtx_capture range")
    if capture_range != "nvtx" and nvtx_capture:
        raise ValueError(
            f"nsys profile: nvtx_capture={nvtx_capture!r} given but capture_range={capture_range!r}"
        )
    if capture_range_end is not None:
        if capture_range == "none":
            raise ValueError("nsys profile: capture_range_end needs a capture_range")
        if not _CAPTURE_END.match(capture_range_end):
            raise ValueError(
                f"nsys profile: capture_range_end={capture_range_end!r} is not none, stop, "
                "stop-shutdown, repeat[:N] or repeat-shutdown:N"
            )
    if not trace:
        raise ValueError("nsys profile: trace is empty")
    argv = [nsys, "profile", f"--trace={','.join(trace)}"]
    if sample is not None:
        argv.append(f"--sample={sample}")
    if cpuctxsw is not None:
        argv.append(f"--cpuctxsw={cpuctxsw}")
    if cuda_graph_trace is not None:
        argv.append(f"--cuda-graph-trace={cuda_graph_trace}")
    if capture_range != "none":
        argv.append(f"--capture-range={capture_range}")
    if capture_range == "nvtx":
        argv.append(f"--nvtx-capture={nvtx_capture}")
        argv += [f"--env-var={k}={v}" for k, v in NVTX_REGISTER_ENV.items()]
    if capture_range_end is not None:
        argv.append(f"--capture-range-end={capture_range_end}")
    argv.append(f"--output={output}")
    if force_overwrite:
        argv.append("--force-overwrite=true")
    return [*argv, *extra, *app_argv]


def nsys_stats_argv(
    report: str | Path,
    output_prefix: str | Path,
    *,
    nsys: str = "nsys",
    reports: Sequence[str] = NSYS_STATS_REPORTS,
) -> list[str]:
    """``nsys stats`` writing ``<output_prefix>_<report>.csv`` for each report."""
    if not reports:
        raise ValueError("nsys stats: no reports requested")
    argv = [nsys, "stats"]
    for name in reports:
        argv += ["--report", name]
    return [
        *argv,
        "--format",
        "csv",
        "--output",
        str(output_prefix),
        "--force-export=true",
        "--force-overwrite=true",
        str(report),
    ]


def nsys_stats_outputs(
    output_prefix: str | Path, reports: Sequence[str] = NSYS_STATS_REPORTS
) -> dict[str, Path]:
    """The CSV each report of :func:`nsys_stats_argv` lands in (nsys names them this way)."""
    return {name: Path(f"{output_prefix}_{name}.csv") for name in reports}


@dataclass(frozen=True)
class NcuPreset:
    """What ncu collects: a section set, single sections and raw metrics."""

    name: str
    section_set: str | None = None
    sections: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()


NCU_PRESETS: Mapping[str, NcuPreset] = MappingProxyType(
    {
        p.name: p
        for p in (
            NcuPreset("roofline", sections=("SpeedOfLight", "SpeedOfLight_RooflineChart")),
            NcuPreset(
                "kernel_overview",
                sections=(
                    "SpeedOfLight",
                    "MemoryWorkloadAnalysis",
                    "Occupancy",
                    "SchedulerStats",
                    "SpeedOfLight_RooflineChart",
                ),
                metrics=(
                    "gpu__time_duration.sum",
                    "dram__bytes_read.sum",
                    "dram__bytes_write.sum",
                    "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                    "sm__throughput.avg.pct_of_peak_sustained_elapsed",
                    "flop_count_hp.sum",
                    "flop_count_sp.sum",
                    "sm__ops_path_tensor_src_bf16_dst_fp32.sum",
                ),
            ),
            NcuPreset("full", section_set="full"),
        )
    }
)
"""``kernel_overview`` is what the shared fixtures were collected with."""


def _collection_flags(preset: NcuPreset) -> list[str]:
    flags: list[str] = []
    if preset.section_set is not None:
        flags += ["--set", preset.section_set]
    for section in preset.sections:
        flags += ["--section", section]
    if preset.metrics:
        flags += ["--metrics", ",".join(preset.metrics)]
    return flags


def nvtx_include_expr(range_name: str, push_pop: bool = True) -> str:
    """An ``--nvtx-include`` expression: push/pop ranges need the trailing slash."""
    if not range_name.strip():
        raise ValueError("ncu: the NVTX range to include is empty")
    if push_pop and not range_name.endswith("/"):
        return f"{range_name}/"
    return range_name


def ncu_profile_argv(
    app_argv: Sequence[str],
    export: str | Path,
    *,
    ncu: str = "ncu",
    preset: str | NcuPreset = "kernel_overview",
    nvtx_include: str | None = None,
    nvtx_push_pop: bool = True,
    kernel_regex: str | None = None,
    kernel_name_base: str | None = None,
    launch_skip: int | None = None,
    launch_count: int | None = None,
    target_processes: str = "all",
    force_overwrite: bool = True,
    extra: Sequence[str] = (),
) -> list[str]:
    """``ncu`` profiling ``app_argv`` into ``<export>.ncu-rep``.

    ``nvtx_include`` turns on ``--nvtx`` and filters to kernels inside that range;
    ``kernel_regex`` becomes ``--kernel-name regex:<regex>``, matched against the name
    ``kernel_name_base`` selects (``--kernel-name-base function|demangled|mangled``; ncu's
    default is ``function``, the bare function name).
    """
    if not app_argv:
        raise ValueError("ncu: app_argv is empty (nothing to profile)")
    chosen = NCU_PRESETS[preset] if isinstance(preset, str) else preset
    for name, value in (("launch_skip", launch_skip), ("launch_count", launch_count)):
        if value is not None and value < (1 if name == "launch_count" else 0):
            raise ValueError(f"ncu: {name}={value} is out of range")
    argv = [ncu, "--target-processes", target_processes]
    if nvtx_include is not None:
        argv += ["--nvtx", "--nvtx-include", nvtx_include_expr(nvtx_include, nvtx_push_pop)]
    if kernel_name_base is not None:
        if kernel_name_base not in KERNEL_NAME_BASES:
            raise ValueError(
                f"ncu: kernel_name_base={kernel_name_base!r} is not one of "
                f"{', '.join(KERNEL_NAME_BASES)}"
            )
        argv += ["--kernel-name-base", kernel_name_base]
    if kernel_regex is not None:
        if not kernel_regex:
            raise ValueError("ncu: kernel_regex is empty")
        argv += ["--kernel-name", f"regex:{kernel_regex}"]
    if launch_skip is not None:
        argv += ["--launch-skip", str(launch_skip)]
    if launch_count is not None:
        argv += ["--launch-count", str(launch_count)]
    argv += _collection_flags(chosen)
    argv += ["--export", str(export)]
    if force_overwrite:
        argv.append("--force-overwrite")
    return [*argv, *extra, *app_argv]


def ncu_import_csv_argv(
    report: str | Path,
    *,
    ncu: str = "ncu",
    page: NcuPage = "details",
    sections: Sequence[str] = (),
    metrics: Sequence[str] = (),
) -> list[str]:
    """``ncu --import <report.ncu-rep> --csv --page details|raw``; the CSV goes to stdout.

    ``sections`` limits the details page to those sections (one file per section is how the
    fixtures' ``ncu.section_<Name>.csv`` were made); ``metrics`` limits the raw page.
    """
    if page not in ("details", "raw"):
        raise ValueError(f"ncu: page={page!r} is not details or raw")
    argv = [ncu, "--import", str(report), "--csv", "--page", page]
    for section in sections:
        argv += ["--section", section]
    if metrics:
        argv += ["--metrics", ",".join(metrics)]
    return argv
