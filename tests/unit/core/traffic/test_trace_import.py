"""Trace import: the real Splitwise fixture, and every kind of bad input named clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpu_simulate_test.core.traffic.trace import load_trace
from gpu_simulate_test.io.artifacts import ArtifactError
from tests.conftest import SPLITWISE_TRACE


def test_real_splitwise_trace_imports() -> None:
    trace = load_trace(SPLITWISE_TRACE, 0, 40960, False)
    assert trace.total_rows == 19366 and len(trace.num_prefill_tokens) == 19366
    assert trace.arrived_at_s is not None and trace.arrived_at_s[0] == 0.0
    assert trace.num_prefill_tokens[:3].tolist() == [374, 396, 879]
    assert trace.num_decode_tokens[:3].tolist() == [44, 109, 55]
    assert np.all(np.diff(trace.arrived_at_s) >= 0)


def test_first_n_and_clipping_on_the_real_trace() -> None:
    trace = load_trace(SPLITWISE_TRACE, 500, 2048, True)
    assert len(trace.num_prefill_tokens) == 500
    assert int((trace.num_prefill_tokens + trace.num_decode_tokens).max()) <= 2048
    assert trace.clipped_rows > 0
    with pytest.raises(ArtifactError, match=r"exceeds the model's max context 2048"):
        load_trace(SPLITWISE_TRACE, 500, 2048, False)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "file is empty (expected a trace CSV"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n", "header but no rows"),
        ("arrived_at,num_prefill_tokens\n0,5\n", "missing required column(s) num_decode_tokens"),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,3\n1,abc,3\n",
            "row 2, column 'num_prefill_tokens': expected a number",
        ),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,3\n1,-4,3\n",
            "row 2, column 'num_prefill_tokens': value -4 is below the minimum 1",
        ),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,3\n1,NaN,3\n",
            "row 2, column 'num_prefill_tokens': empty value or NaN",
        ),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,3\n1,4,0\n",
            "row 2, column 'num_decode_tokens': value 0 is below the minimum 1",
        ),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,3\n2,4,3\n1,4,3\n",
            "row 3, column 'arrived_at': values must be sorted",
        ),
        (
            "arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,3\n1,4000,200\n",
            "row 2: num_prefill_tokens + num_decode_tokens = 4200 exceeds",
        ),
    ],
)
def test_bad_traces_fail_naming_file_row_and_column(
    tmp_path: Path, text: str, message: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ArtifactError) as err:
        load_trace(path, 0, 4096, False)
    assert message in str(err.value)
    assert str(path) in str(err.value)


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(
        ArtifactError, match=r"workload.trace_file=.*nope\.csv: file does not exist"
    ):
        load_trace(tmp_path / "nope.csv", 0, 4096, False)


def test_lengths_only_trace_has_no_arrivals(tmp_path: Path) -> None:
    trace = load_trace(
        write(tmp_path, "num_prefill_tokens,num_decode_tokens\n5,3\n7,2\n"), 0, 4096, False
    )
    assert trace.arrived_at_s is None and trace.num_prefill_tokens.tolist() == [5, 7]
