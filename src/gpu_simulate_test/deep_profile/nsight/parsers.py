"""Typed records from ``nsys stats --format csv`` and ``ncu --csv`` output.

nsys summary reports (``cuda_gpu_kern_sum``, ``cuda_api_sum``, ``nvtx_sum``) give times in the
unit named in the header (``Total Time (ns)`` by default); records carry milliseconds. Names are
C++ signatures quoted because they contain commas; the ``csv`` module handles that. Text nsys
prints before the header when its stdout is captured ("Generating SQLite file ...",
"Processing [...] with [...]...") is skipped.

ncu ``--csv`` exports of the details page, of one section (``--section X --page details``) or of
``--metrics`` share one long layout: one row per (kernel, section, metric) with ``Metric Unit``
and ``Metric Value`` columns; rule results are rows with an empty metric name and a
``Rule Name``. Values carry thousands separators ("13,485") and per-row units ("Mbyte",
"usecond", "Ghz", "%"); :func:`to_base_unit` turns them into bytes, seconds, Hz, bytes/s and
percent. ``--page raw --csv`` writes a wide table instead (row 1 metric names, row 2 units,
then one row per kernel); :func:`parse_ncu_csv` reads both.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from gpu_simulate_test.deep_profile.nsight.units import parse_number, to_base_unit

_TIME_TO_MS: Mapping[str, float] = MappingProxyType({"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3})
_HEADER_TIME = re.compile(r"^(?P<label>.+?) \((?P<unit>ns|us|ms|s)\)$")


class NsightParseError(ValueError):
    """A file is not the Nsight CSV it should be; the message names the file and what is missing."""


# ---------------------------------------------------------------------------------------------
# nsys stats summaries


@dataclass(frozen=True)
class KernelRecord:
    """One row of ``cuda_gpu_kern_sum``: a kernel's GPU time over the capture."""

    kernel_name: str
    device: str | None
    """Device column when the report has one (per-GPU variants); None otherwise."""
    total_ms: float
    calls: int
    mean_ms: float
    median_ms: float | None
    min_ms: float
    max_ms: float
    stddev_ms: float | None
    share_pct: float
    """``Time (%)``: this kernel's share of all kernel time, as nsys rounded it."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ApiCallRecord:
    """One row of ``cuda_api_sum``: host time spent in one CUDA API function."""

    api_name: str
    total_ms: float
    calls: int
    mean_ms: float
    median_ms: float | None
    min_ms: float
    max_ms: float
    stddev_ms: float | None
    share_pct: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NvtxRangeRecord:
    """One row of ``nvtx_sum``: wall time of one NVTX range name (CPU side)."""

    range_name: str
    style: str
    """``PushPop`` or ``StartEnd`` (older nsys wrote ``Push/Pop``); empty when not reported."""
    total_ms: float
    instances: int
    mean_ms: float
    median_ms: float | None
    min_ms: float
    max_ms: float
    stddev_ms: float | None
    share_pct: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _read_text(source: str | Path) -> tuple[str, str]:
    """(text, where) for a path or for CSV text itself (anything containing a newline)."""
    if isinstance(source, Path) or "\n" not in source:
        path = Path(source)
        if not path.is_file():
            raise NsightParseError(f"{path}: no such file")
        return path.read_text(encoding="utf-8", errors="replace"), str(path)
    return source, "<text>"


def _summary_rows(
    source: str | Path, name_columns: Sequence[str]
) -> tuple[list[dict[str, str]], dict[str, tuple[str, float]], str]:
    """Rows of an nsys summary CSV, {label: (time column, ms factor)}, and where it came from."""
    text, where = _read_text(source)
    lines = text.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if line.startswith(("Time (%)", '"Time (%)"'))), None
    )
    if start is None:
        raise NsightParseError(
            f"{where}: no 'Time (%),Total Time (..)' header (not nsys stats CSV)"
        )
    reader = csv.DictReader(io.StringIO("\n".join(lines[start:])))
    header = list(reader.fieldnames or [])
    time_columns: dict[str, tuple[str, float]] = {}
    for column in header:
        match = _HEADER_TIME.match(column)
        if match:
            time_columns[match["label"]] = (column, _TIME_TO_MS[match["unit"]])
    missing = [c for c in ("Total Time", "Avg", "Min", "Max") if c not in time_columns]
    name_column = next((c for c in name_columns if c in header), None)
    if name_column is None:
        missing.append(" or ".join(name_columns))
    if missing:
        raise NsightParseError(f"{where}: missing columns {missing}; header is {header}")
    rows = []
    for row in reader:
        if not any((v or "").strip() for v in row.values() if isinstance(v, str)):
            break  # a blank line ends this report (several reports may share a stdout dump)
        row["__name__"] = row[name_column]
        rows.append(row)
    return rows, time_columns, where


def _time_ms(
    row: dict[str, str], time_columns: dict[str, tuple[str, float]], label: str
) -> float | None:
    if label not in time_columns:
        return None
    column, factor = time_columns[label]
    raw = (row.get(column) or "").strip()
    return None if raw == "" else parse_number(raw) * factor


def _stats(
    row: dict[str, str], time_columns: dict[str, tuple[str, float]], where: str, count_field: str
) -> dict[str, Any]:
    """The timing fields every summary record shares, the count under ``count_field``."""
    try:
        count_raw = row.get("Instances") or row.get("Num Calls") or row.get("Count") or "0"
        return {
            "total_ms": _time_ms(row, time_columns, "Total Time") or 0.0,
            count_field: int(parse_number(count_raw)),
            "mean_ms": _time_ms(row, time_columns, "Avg") or 0.0,
            "median_ms": _time_ms(row, time_columns, "Med"),
            "min_ms": _time_ms(row, time_columns, "Min") or 0.0,
            "max_ms": _time_ms(row, time_columns, "Max") or 0.0,
            "stddev_ms": _time_ms(row, time_columns, "StdDev"),
            "share_pct": parse_number(row.get("Time (%)") or "0"),
        }
    except ValueError as err:
        raise NsightParseError(f"{where}: bad row for {row['__name__']!r}: {err}") from err


def parse_kernel_summary(source: str | Path) -> list[KernelRecord]:
    """``nsys stats --report cuda_gpu_kern_sum --format csv`` → records, in file order."""
    rows, factors, where = _summary_rows(source, ("Name", "Kernel Name"))
    return [
        KernelRecord(
            kernel_name=row["__name__"],
            device=row.get("Device") or row.get("GPU") or None,
            **_stats(row, factors, where, "calls"),
        )
        for row in rows
    ]


def parse_api_summary(source: str | Path) -> list[ApiCallRecord]:
    """``nsys stats --report cuda_api_sum --format csv`` → records, in file order."""
    rows, factors, where = _summary_rows(source, ("Name",))
    return [
        ApiCallRecord(api_name=row["__name__"], **_stats(row, factors, where, "calls"))
        for row in rows
    ]


def parse_nvtx_summary(source: str | Path) -> list[NvtxRangeRecord]:
    """``nsys stats --report nvtx_sum --format csv`` → records, in file order.

    Range names as nsys writes them: a leading ``:`` means the range has no domain.
    """
    rows, factors, where = _summary_rows(source, ("Range", "Name"))
    return [
        NvtxRangeRecord(
            range_name=row["__name__"],
            style=row.get("Style", "") or "",
            **_stats(row, factors, where, "instances"),
        )
        for row in rows
    ]


# ---------------------------------------------------------------------------------------------
# ncu --csv


@dataclass(frozen=True)
class NcuMetric:
    """One metric of one profiled kernel, with its value normalized to the base unit."""

    kernel_id: int
    kernel_name: str
    section: str
    """Section display name ("GPU Speed Of Light Throughput"; "" on the raw page)."""
    body_item: str
    """Roofline chart body item ("Single Precision Roofline"); "" elsewhere."""
    metric_name: str
    unit: str
    """Unit as ncu printed it ("Mbyte", "usecond", "Ghz", "%", "" for plain numbers)."""
    raw_value: str
    value: float | None
    """The number in ``unit``; None when ncu wrote ``n/a`` or a non-number."""
    base_value: float | None
    """``value`` in ``base_unit``."""
    base_unit: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NcuRule:
    """A rule result ncu attached to a section (e.g. ``SOLBottleneck``)."""

    kernel_id: int
    section: str
    rule_name: str
    rule_type: str
    """OPT (optimization advice), INF (information), WRN (warning)."""
    description: str
    speedup_type: str
    """``local`` or ``global``; "" when ncu estimates none."""
    estimated_speedup_pct: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NcuKernel:
    """Launch identity of one profiled kernel."""

    kernel_id: int
    kernel_name: str
    process_name: str
    device: str
    compute_capability: str
    block_size: str
    grid_size: str
    stream: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class NcuReport:
    """Everything read from one or more ncu CSV exports."""

    kernels: tuple[NcuKernel, ...]
    metrics: tuple[NcuMetric, ...]
    rules: tuple[NcuRule, ...]

    def metric(
        self,
        name: str,
        kernel_id: int | None = None,
        section: str | None = None,
        body_item: str | None = None,
    ) -> NcuMetric:
        """The unique metric called ``name`` (filtered by kernel, section, body item)."""
        found = [
            m
            for m in self.metrics
            if m.metric_name == name
            and (kernel_id is None or m.kernel_id == kernel_id)
            and (section is None or m.section == section)
            and (body_item is None or m.body_item == body_item)
        ]
        if len(found) != 1:
            where = f"kernel_id={kernel_id} section={section!r} body_item={body_item!r}"
            raise KeyError(f"metric {name!r} ({where}): {len(found)} matches, expected 1")
        return found[0]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernels": [k.to_dict() for k in self.kernels],
            "metrics": [m.to_dict() for m in self.metrics],
            "rules": [r.to_dict() for r in self.rules],
        }


_LONG_REQUIRED = ("ID", "Kernel Name", "Section Name", "Metric Name", "Metric Unit", "Metric Value")


def _metric(
    kernel_id: int, kernel_name: str, section: str, body: str, name: str, unit: str, raw: str
) -> NcuMetric:
    try:
        value: float | None = parse_number(raw)
    except ValueError:
        value = None
    base_value, base_unit = (None, unit) if value is None else to_base_unit(value, unit)
    return NcuMetric(
        kernel_id, kernel_name, section, body, name, unit, raw, value, base_value, base_unit
    )


def _kernel_of(row: dict[str, str]) -> NcuKernel:
    return NcuKernel(
        kernel_id=int(row["ID"]),
        kernel_name=row.get("Kernel Name", ""),
        process_name=row.get("Process Name", ""),
        device=row.get("Device", ""),
        compute_capability=row.get("CC", ""),
        block_size=row.get("Block Size", ""),
        grid_size=row.get("Grid Size", ""),
        stream=row.get("Stream", ""),
    )


def _parse_long(rows: list[dict[str, str]], where: str) -> NcuReport:
    kernels: dict[int, NcuKernel] = {}
    metrics: list[NcuMetric] = []
    rules: list[NcuRule] = []
    for row in rows:
        try:
            kernel_id = int(row["ID"])
        except (TypeError, ValueError) as err:
            raise NsightParseError(f"{where}: bad ID {row.get('ID')!r}") from err
        kernels.setdefault(kernel_id, _kernel_of(row))
        if row["Metric Name"]:
            metrics.append(
                _metric(
                    kernel_id,
                    row["Kernel Name"],
                    row["Section Name"],
                    row.get("Body Item Label", "") or "",
                    row["Metric Name"],
                    row["Metric Unit"] or "",
                    row["Metric Value"] or "",
                )
            )
        elif row.get("Rule Name"):
            speedup = row.get("Estimated Speedup") or ""
            rules.append(
                NcuRule(
                    kernel_id=kernel_id,
                    section=row["Section Name"],
                    rule_name=row["Rule Name"],
                    rule_type=row.get("Rule Type", "") or "",
                    description=row.get("Rule Description", "") or "",
                    speedup_type=row.get("Estimated Speedup Type", "") or "",
                    estimated_speedup_pct=parse_number(speedup) if speedup else None,
                )
            )
    return NcuReport(tuple(kernels.values()), tuple(metrics), tuple(rules))


_RAW_IDENTITY: frozenset[str] = frozenset(
    {
        "ID",
        "Process ID",
        "Process Name",
        "Host Name",
        "Kernel Name",
        "Context",
        "Stream",
        "Block Size",
        "Grid Size",
        "Device",
        "CC",
    }
)


def _parse_wide(table: list[list[str]], where: str) -> NcuReport:
    if len(table) < 2:
        raise NsightParseError(f"{where}: raw page needs a header row and a units row")
    header, units = table[0], table[1]
    kernels: list[NcuKernel] = []
    metrics: list[NcuMetric] = []
    for cells in table[2:]:
        if not any(cells):
            continue
        row = dict(zip(header, cells, strict=False))
        kernel = _kernel_of(row)
        kernels.append(kernel)
        for name, unit, raw in zip(header, units, cells, strict=False):
            if name not in _RAW_IDENTITY:
                metrics.append(
                    _metric(kernel.kernel_id, kernel.kernel_name, "", "", name, unit, raw)
                )
    return NcuReport(tuple(kernels), tuple(metrics), ())


def parse_ncu_csv(source: str | Path) -> NcuReport:
    """One ``ncu --csv`` export (details page, a section, metrics, or the raw page)."""
    text, where = _read_text(source)
    lines = text.splitlines()
    # ncu may print "==PROF==" lines before the table when stdout is captured
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise NsightParseError(f'{where}: no header row starting with "ID" (not ncu --csv)')
    table = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header = table[0]
    if "Metric Name" in header:
        missing = [c for c in _LONG_REQUIRED if c not in header]
        if missing:
            raise NsightParseError(f"{where}: missing columns {missing}")
        rows = [dict(zip(header, cells, strict=False)) for cells in table[1:] if any(cells)]
        return _parse_long(rows, where)
    return _parse_wide(table, where)


def merge_reports(reports: Iterable[NcuReport]) -> NcuReport:
    """One report from several exports of the same run; duplicated metrics and rules kept once."""
    kernels: dict[int, NcuKernel] = {}
    metrics: dict[tuple[int, str, str, str], NcuMetric] = {}
    rules: dict[tuple[int, str, str], NcuRule] = {}
    for report in reports:
        for k in report.kernels:
            kernels.setdefault(k.kernel_id, k)
        for m in report.metrics:
            metrics.setdefault((m.kernel_id, m.section, m.body_item, m.metric_name), m)
        for r in report.rules:
            rules.setdefault((r.kernel_id, r.section, r.rule_name), r)
    return NcuReport(tuple(kernels.values()), tuple(metrics.values()), tuple(rules.values()))


def load_ncu_dir(directory: str | Path, pattern: str = "ncu.*.csv") -> NcuReport:
    """All ``ncu.*.csv`` exports of one kernel directory, merged."""
    paths = sorted(Path(directory).glob(pattern))
    if not paths:
        raise NsightParseError(f"{directory}: no files matching {pattern}")
    return merge_reports(parse_ncu_csv(p) for p in paths)
