"""The artifact contract: declared, versioned table schemas and validating, atomic readers/writers.

Every CSV a stage writes or reads goes through :func:`write_csv` / :func:`read_csv` with a
:class:`TableSchema`; every JSON through :func:`write_json` / :func:`read_json`. Writes go to a
temporary file in the same directory and are renamed into place, so a crash never leaves a
half-written file under the final name.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Literal, TypeGuard

import numpy as np
import pandas as pd

Dtype = Literal["int", "float", "str", "bool"]


class ArtifactError(ValueError):
    """An artifact is missing or does not match its declared schema; the message says where."""


@dataclass(frozen=True)
class Column:
    """One declared column: name, dtype, unit and the checks applied to its values."""

    name: str
    dtype: Dtype
    unit: str = ""
    description: str = ""
    nullable: bool = False
    """Empty cells allowed (e.g. TTFT of a failed request)."""
    min_value: float | None = None
    """Smallest allowed value for numeric columns (inclusive)."""
    allowed: tuple[str, ...] = ()
    """The only values a ``str`` column may hold (empty: any)."""


@dataclass(frozen=True)
class TableSchema:
    """A declared table: its name, schema version and required columns, in order."""

    name: str
    version: str
    columns: tuple[Column, ...]
    description: str = ""
    sorted_by: str | None = None
    """A column that must be non-decreasing (e.g. arrival times)."""
    unique: str | None = None
    """A column whose values must be unique (e.g. request ids)."""
    optional: tuple[Column, ...] = ()
    """Declared columns a file may lack (files written before they existed, writers that have
    none): checked like the others where present, never required, written after them."""

    @property
    def column_names(self) -> list[str]:
        """The required columns, in order."""
        return [c.name for c in self.columns]

    @property
    def optional_names(self) -> list[str]:
        return [c.name for c in self.optional]

    def column(self, name: str) -> Column:
        for col in (*self.columns, *self.optional):
            if col.name == name:
                return col
        raise KeyError(f"{self.name} has no column {name!r}")


# --------------------------------------------------------------------------------------------
# Atomic writes
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """A temporary sibling of ``path`` for a writer that wants a file name (a library's own save
    function); renamed over ``path`` when the block ends without error.

    On any exception the temporary file is removed and ``path`` is left as it was.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".part", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    os.chmod(tmp, 0o644)  # mkstemp makes 0600; artifacts are ordinary readable files
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


@contextlib.contextmanager
def atomic_open(
    path: Path | str, mode: str = "w", encoding: str | None = "utf-8"
) -> Iterator[IO[Any]]:
    """Open a temporary sibling of ``path`` for writing and rename it over ``path`` on success
    (:func:`atomic_path`), flushed to disk first.

    On any exception the temporary file is removed and ``path`` is left as it was.
    """
    with (
        atomic_path(path) as tmp,
        open(tmp, mode, encoding=None if "b" in mode else encoding) as handle,
    ):
        yield handle
        handle.flush()
        os.fsync(handle.fileno())


def _json_default(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _clean_json(value: Any) -> Any:
    """Replace NaN/inf floats (not valid JSON) with None, recursively."""
    if isinstance(value, float | np.floating) and not math.isfinite(float(value)):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean_json(v) for v in value]
    return value


def as_stored_json(value: Any) -> Any:
    """``value`` as :func:`write_json` stores it and :func:`read_json` gives it back (tuples as
    lists, NaN as None, numpy scalars as numbers): for comparing with what a file recorded."""
    return json.loads(json.dumps(_clean_json(value), default=_json_default))


def write_json(path: Path | str, data: Mapping[str, Any]) -> Path:
    """Write ``data`` as JSON (sorted keys, 2-space indent, NaN as null), atomically."""
    text = json.dumps(_clean_json(data), indent=2, sort_keys=True, default=_json_default)
    with atomic_open(path) as handle:
        handle.write(text + "\n")
    return Path(path)


def read_json(path: Path | str, required_keys: Sequence[str] = ()) -> dict[str, Any]:
    """Read a JSON object; a missing file, bad JSON or a missing key fails naming the file."""
    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"{p}: file does not exist")
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise not_utf8_error(p, "a JSON object") from exc
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{p}: not valid JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ArtifactError(f"{p}: expected a JSON object, got {type(data).__name__}")
    missing = [k for k in required_keys if k not in data]
    if missing:
        raise ArtifactError(f"{p}: missing required key(s) {', '.join(missing)}")
    return data


def not_utf8_error(path: Path, expected: str) -> ArtifactError:
    """The error for a file that is not UTF-8 text (a binary file, or another encoding): it names
    the file, the first bad line and byte, and what was ``expected``.

    The file is scanned again line by line, because decoders report offsets within the chunk they
    were given, not within the file (and a newline byte never occurs inside a UTF-8 character).
    """
    with path.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                return ArtifactError(
                    f"{path}, line {lineno}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); "
                    f"expected {expected}"
                )
    return ArtifactError(f"{path}: not UTF-8 text; expected {expected}")


def is_finite_number(value: object) -> TypeGuard[int | float]:
    """Whether a value read from JSON is a finite number (not a bool, a string or null): a
    time, a rate, a date's timestamp."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def write_jsonl(path: Path | str, rows: Sequence[Mapping[str, Any]]) -> Path:
    """Write one JSON object per line, atomically."""
    with atomic_open(path) as handle:
        for row in rows:
            handle.write(json.dumps(_clean_json(row), sort_keys=True, default=_json_default))
            handle.write("\n")
    return Path(path)


def read_jsonl(path: Path | str) -> list[dict[str, Any]]:
    """Read a JSON-lines file; a bad line fails with the file and line number."""
    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"{p}: file does not exist")
    rows: list[dict[str, Any]] = []
    with p.open("rb") as handle:
        for lineno, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise not_utf8_error(p, "one JSON object per line") from exc
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ArtifactError(f"{p}, line {lineno}: not valid JSON ({exc})") from exc
            if not isinstance(row, dict):
                raise ArtifactError(f"{p}, line {lineno}: expected a JSON object")
            rows.append(row)
    return rows


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def _shown(value: Any) -> str:
    """``value`` for an error message: ``10.7`` or ``'abc'``, never ``np.float64(10.7)``."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _coerce_column(frame: pd.DataFrame, col: Column, where: str) -> pd.Series:
    """Return ``frame[col.name]`` converted to the declared dtype, or raise naming the bad row."""
    series = frame[col.name]
    missing = series.isna()
    if col.dtype == "str":
        if not col.nullable and missing.any():
            row = int(np.flatnonzero(missing.to_numpy())[0])
            raise ArtifactError(f"{where}: row {row + 1}, column {col.name!r}: empty value")
        if col.allowed:
            unknown = ~series.isin(col.allowed) & ~missing
            if unknown.any():
                row = int(np.flatnonzero(unknown.to_numpy())[0])
                raise ArtifactError(
                    f"{where}: row {row + 1}, column {col.name!r}: {_shown(series.iloc[row])} is "
                    f"not one of {', '.join(col.allowed)}"
                )
        return series.astype("string") if not missing.all() else series
    if col.dtype == "bool":
        mapping = {"true": True, "false": False, "1": True, "0": False}
        lowered = series.astype("string").str.strip().str.lower()
        bad = ~lowered.isin(list(mapping)) & ~missing
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise ArtifactError(
                f"{where}: row {row + 1}, column {col.name!r}: expected true/false, "
                f"got {_shown(series.iloc[row])}"
            )
        return lowered.map(mapping).astype("boolean")
    numeric = pd.to_numeric(series, errors="coerce")
    bad = numeric.isna() & ~missing
    if bad.any():
        row = int(np.flatnonzero(bad.to_numpy())[0])
        raise ArtifactError(
            f"{where}: row {row + 1}, column {col.name!r}: expected a number ({col.dtype}), "
            f"got {_shown(series.iloc[row])}"
        )
    if not col.nullable and numeric.isna().any():
        row = int(np.flatnonzero(numeric.isna().to_numpy())[0])
        raise ArtifactError(f"{where}: row {row + 1}, column {col.name!r}: empty value or NaN")
    values = numeric.to_numpy(dtype=float)
    finite = np.isfinite(values) | np.isnan(values)
    if not finite.all():
        row = int(np.flatnonzero(~finite)[0])
        raise ArtifactError(f"{where}: row {row + 1}, column {col.name!r}: value is infinite")
    if col.min_value is not None:
        below = values < col.min_value
        if below.any():
            row = int(np.flatnonzero(below)[0])
            raise ArtifactError(
                f"{where}: row {row + 1}, column {col.name!r}: value {values[row]:g} is below "
                f"the minimum {col.min_value:g}"
            )
    if col.dtype == "int":
        fractional = ~np.isnan(values) & (values != np.round(values))
        if fractional.any():
            row = int(np.flatnonzero(fractional)[0])
            raise ArtifactError(
                f"{where}: row {row + 1}, column {col.name!r}: expected an integer, "
                f"got {_shown(values[row])}"
            )
        return numeric.astype("Int64") if col.nullable else numeric.astype("int64")
    return numeric.astype("float64")


def validate_frame(frame: pd.DataFrame, schema: TableSchema, where: str = "") -> pd.DataFrame:
    """Check ``frame`` against ``schema`` and return it with declared dtypes.

    Required columns must be present, optional ones are checked where present; extra columns are
    kept. ``where`` names the file in errors.
    """
    where = where or f"table {schema.name}"
    missing = [c for c in schema.column_names if c not in frame.columns]
    if missing:
        raise ArtifactError(
            f"{where}: missing required column(s) {', '.join(missing)} "
            f"(schema {schema.name} v{schema.version} expects {', '.join(schema.column_names)})"
        )
    out = frame.copy()
    for col in (*schema.columns, *(c for c in schema.optional if c.name in out.columns)):
        out[col.name] = _coerce_column(out, col, where)
    if schema.unique is not None:
        dup = out[schema.unique].duplicated()
        if dup.any():
            row = int(np.flatnonzero(dup.to_numpy())[0])
            raise ArtifactError(
                f"{where}: row {row + 1}, column {schema.unique!r}: duplicate value "
                f"{_shown(out[schema.unique].iloc[row])}"
            )
    if schema.sorted_by is not None and len(out) > 1:
        values = out[schema.sorted_by].to_numpy(dtype=float)
        present = np.flatnonzero(~np.isnan(values))  # a nullable column's empty cells are skipped
        drops = np.flatnonzero(np.diff(values[present]) < 0)
        if drops.size:
            row, previous = int(present[drops[0] + 1]), int(present[drops[0]])
            raise ArtifactError(
                f"{where}: row {row + 1}, column {schema.sorted_by!r}: values must be sorted "
                f"(non-decreasing); {values[row]:g} follows {values[previous]:g}"
            )
    return out


def write_csv(path: Path | str, frame: pd.DataFrame, schema: TableSchema) -> Path:
    """Validate ``frame`` and write it atomically: required columns, the optional ones it has,
    then extras."""
    p = Path(path)
    checked = validate_frame(frame, schema, where=f"{p} (writing)")
    optional = [c for c in schema.optional_names if c in checked.columns]
    declared = schema.column_names + optional
    extras = [c for c in checked.columns if c not in declared]
    with atomic_open(p) as handle:
        checked[declared + extras].to_csv(handle, index=False, lineterminator="\n")
    return p


def read_csv(path: Path | str, schema: TableSchema) -> pd.DataFrame:
    """Read and validate a CSV; errors name the file, row and column."""
    p = Path(path)
    if not p.is_file():
        raise ArtifactError(f"{p}: file does not exist (expected table {schema.name})")
    frame = read_csv_text(p, f"table {schema.name}")
    return validate_frame(frame, schema, where=str(p))


def read_csv_text(path: Path, expected: str) -> pd.DataFrame:
    """Read a CSV with every cell as a string (empty ones NaN) and column names stripped.

    An empty, malformed (a row with more fields than the header) or non-UTF-8 file fails with an
    :class:`ArtifactError` naming the file, the line where known, and what was ``expected``.
    """
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=True)
    except UnicodeDecodeError as exc:
        raise not_utf8_error(path, expected) from exc
    except pd.errors.EmptyDataError as exc:
        raise ArtifactError(f"{path}: file is empty (expected {expected})") from exc
    except pd.errors.ParserError as exc:
        # pandas says e.g. "Error tokenizing data. C error: Expected 3 fields in line 3, saw 4"
        detail = str(exc).strip().removeprefix("Error tokenizing data. C error: ")
        raise ArtifactError(f"{path}: not a valid CSV ({detail}); expected {expected}") from exc
    frame.columns = [str(c).strip() for c in frame.columns]
    _check_row_widths(path, len(frame.columns), expected)
    return frame


def _check_row_widths(path: Path, width: int, expected: str) -> None:
    """Fail on a row with fewer fields than the header (pandas fills those with NaN): a file cut
    short mid-row, or a hand edit, would otherwise pass as a row with empty trailing cells."""
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.reader(handle)
        for fields in reader:
            if fields and len(fields) < width:
                raise ArtifactError(
                    f"{path}, line {reader.line_num}: {len(fields)} fields, the header has {width} "
                    f"(a truncated or edited file?); expected {expected}"
                )


# --------------------------------------------------------------------------------------------
# Stable ids
# --------------------------------------------------------------------------------------------


def _canonical(value: Any) -> str:
    return json.dumps(
        _clean_json(value), sort_keys=True, default=_json_default, separators=(",", ":")
    )


def stable_id(parts: Sequence[Any] | Mapping[str, Any], prefix: str = "", length: int = 12) -> str:
    """A short deterministic id: sha256 of the canonical JSON of ``parts``, hex-truncated.

    The same parts always give the same id, across processes and machines.
    """
    if not 4 <= length <= 64:
        raise ValueError(f"length must be within 4..64, got {length}")
    digest = hashlib.sha256(_canonical(parts).encode("utf-8")).hexdigest()[:length]
    return (
        f"{prefix}{digest}" if not prefix or prefix.endswith(("-", "_")) else f"{prefix}-{digest}"
    )
