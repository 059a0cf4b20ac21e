"""The artifact contract: schemas validate on write and read, writes are atomic, ids are stable."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.io.artifacts import (
    ArtifactError,
    Column,
    TableSchema,
    atomic_open,
    read_csv,
    read_json,
    read_jsonl,
    stable_id,
    validate_frame,
    write_csv,
    write_json,
    write_jsonl,
)
from gpu_simulate_test.io.schemas import ALL_TABLES, TRACE_INTERVALS, TRACE_LENGTHS


def lengths_frame(**overrides: list) -> pd.DataFrame:
    data = {
        "request_id": [0, 1, 2],
        "num_prefill_tokens": [10, 20, 30],
        "num_decode_tokens": [5, 6, 7],
    }
    data.update(overrides)
    return pd.DataFrame(data)


def test_write_then_read_round_trips_with_declared_dtypes(tmp_path: Path) -> None:
    path = write_csv(tmp_path / "lengths.csv", lengths_frame(), TRACE_LENGTHS)
    back = read_csv(path, TRACE_LENGTHS)
    assert back.columns.tolist() == TRACE_LENGTHS.column_names
    assert back["num_prefill_tokens"].tolist() == [10, 20, 30]
    assert str(back["num_decode_tokens"].dtype) == "int64"


def test_extra_columns_are_kept_after_declared_ones(tmp_path: Path) -> None:
    frame = lengths_frame(note=["a", "b", "c"])[
        ["note", "request_id", "num_prefill_tokens", "num_decode_tokens"]
    ]
    path = write_csv(tmp_path / "x.csv", frame, TRACE_LENGTHS)
    assert (
        path.read_text().splitlines()[0] == "request_id,num_prefill_tokens,num_decode_tokens,note"
    )


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (
            lengths_frame().drop(columns=["num_decode_tokens"]),
            "missing required column(s) num_decode_tokens",
        ),
        (
            lengths_frame(num_prefill_tokens=["10", "x", "30"]),
            "row 2, column 'num_prefill_tokens': expected a number",
        ),
        (
            lengths_frame(num_prefill_tokens=[10, -1, 30]),
            "row 2, column 'num_prefill_tokens': value -1 is below the minimum 1",
        ),
        (
            lengths_frame(num_decode_tokens=[5, float("nan"), 7]),
            "row 2, column 'num_decode_tokens': empty value or NaN",
        ),
        (
            lengths_frame(num_decode_tokens=[5, 0, 7]),
            "row 2, column 'num_decode_tokens': value 0 is below the minimum 1",
        ),
        (
            lengths_frame(num_decode_tokens=[5, 6.5, 7]),
            "row 2, column 'num_decode_tokens': expected an integer",
        ),
        (lengths_frame(request_id=[0, 1, 1]), "row 3, column 'request_id': duplicate value"),
    ],
)
def test_bad_frames_are_rejected_naming_row_and_column(frame: pd.DataFrame, message: str) -> None:
    with pytest.raises(ArtifactError) as err:
        validate_frame(frame, TRACE_LENGTHS, where="lengths.csv")
    assert message in str(err.value)
    assert str(err.value).startswith("lengths.csv")


def test_unsorted_arrivals_are_rejected() -> None:
    frame = pd.DataFrame(
        {"request_id": [0, 1, 2], "arrival_time_s": [0.0, 2.0, 1.0], "inter_arrival_s": [0, 2, 0]}
    )
    with pytest.raises(
        ArtifactError, match=r"row 3, column 'arrival_time_s': values must be sorted"
    ):
        validate_frame(frame, TRACE_INTERVALS)


def test_read_csv_names_the_file_when_missing_or_empty(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"nope\.csv: file does not exist"):
        read_csv(tmp_path / "nope.csv", TRACE_LENGTHS)
    (tmp_path / "empty.csv").write_text("")
    with pytest.raises(ArtifactError, match=r"empty\.csv: file is empty"):
        read_csv(tmp_path / "empty.csv", TRACE_LENGTHS)


def test_failed_write_leaves_neither_partial_nor_temporary_file(tmp_path: Path) -> None:
    target = tmp_path / "lengths.csv"
    target.write_text("previous content\n")
    with pytest.raises(ArtifactError):
        write_csv(target, lengths_frame(num_prefill_tokens=[1, -5, 3]), TRACE_LENGTHS)
    with pytest.raises(RuntimeError), atomic_open(target) as handle:
        handle.write("half")
        raise RuntimeError("crash mid-write")
    assert target.read_text() == "previous content\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lengths.csv"]


def test_json_is_sorted_indented_and_nan_free(tmp_path: Path) -> None:
    path = write_json(
        tmp_path / "m.json", {"b": 1, "a": {"z": np.float64("nan"), "y": np.int64(3)}}
    )
    assert path.read_text() == '{\n  "a": {\n    "y": 3,\n    "z": null\n  },\n  "b": 1\n}\n'
    assert read_json(path, required_keys=("a",))["a"]["y"] == 3
    with pytest.raises(ArtifactError, match=r"m\.json: missing required key\(s\) c"):
        read_json(path, required_keys=("c",))
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ArtifactError, match=r"bad\.json: not valid JSON"):
        read_json(tmp_path / "bad.json")


def test_jsonl_round_trip_and_bad_line(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "p.jsonl", [{"a": 1}, {"a": 2}])
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    path.write_text('{"a": 1}\n{oops\n')
    with pytest.raises(ArtifactError, match=r"p\.jsonl, line 2"):
        read_jsonl(path)


def test_stable_id_is_deterministic_and_content_sensitive() -> None:
    a = stable_id({"x": 1, "y": [1, 2]}, prefix="wl", length=10)
    assert a == stable_id({"y": [1, 2], "x": 1}, prefix="wl", length=10)
    assert a.startswith("wl-") and len(a) == len("wl-") + 10
    assert a != stable_id({"x": 2, "y": [1, 2]}, prefix="wl", length=10)
    assert stable_id(["a"]) == hashlib.sha256(b'["a"]').hexdigest()[:12]  # canonical JSON, sha256
    with pytest.raises(ValueError):
        stable_id(["a"], length=2)


def test_every_declared_table_has_unique_snake_case_columns_with_units() -> None:
    for table in ALL_TABLES:
        names = table.column_names
        assert len(names) == len(set(names)), table.name
        for col in table.columns:
            assert col.name == col.name.lower() and " " not in col.name, col.name
            if col.name.endswith("_s"):
                assert col.unit == "s", (table.name, col.name)
            if col.name.startswith("num_") and col.name.endswith("_tokens"):
                assert col.unit == "tokens", (table.name, col.name)


def test_custom_schema_bool_and_str_columns() -> None:
    schema = TableSchema("t", "1.0", (Column("flag", "bool"), Column("name", "str")))
    frame = validate_frame(pd.DataFrame({"flag": ["true", "0"], "name": ["a", "b"]}), schema)
    assert frame["flag"].tolist() == [True, False]
    with pytest.raises(ArtifactError, match="expected true/false"):
        validate_frame(pd.DataFrame({"flag": ["maybe"], "name": ["a"]}), schema)
    with pytest.raises(ArtifactError, match="empty value"):
        validate_frame(pd.DataFrame({"flag": ["1"], "name": [None]}), schema)


def test_written_json_is_plain_json(tmp_path: Path) -> None:
    write_json(tmp_path / "a.json", {"inf": float("inf")})
    assert json.loads((tmp_path / "a.json").read_text()) == {"inf": None}
