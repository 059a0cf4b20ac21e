"""Bad input fails with one clear error naming the file, the row or line, the field and what was
expected: binary files, malformed CSV rows, bad values, bad config keys, unfinished runs."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from gpu_simulate_test.config.registry import to_typed
from gpu_simulate_test.config.schema import ConfigError, WorkloadStageConfig
from gpu_simulate_test.core.traffic.trace import load_trace
from gpu_simulate_test.core.traffic.workloads import load_workload
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import (
    ArtifactError,
    read_csv,
    read_json,
    read_jsonl,
    validate_frame,
    write_csv,
    write_json,
)
from gpu_simulate_test.io.runs import default_run_id, open_upstream_run, start_run
from gpu_simulate_test.io.schemas import REQUEST_METRICS, REQUEST_STATUSES, TRACE_LENGTHS

BINARY = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe\x00\x10"


# --------------------------------------------------------------------------------------------
# Binary (non-UTF-8) files
# --------------------------------------------------------------------------------------------


def test_binary_trace_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "binary.csv"
    path.write_bytes(b"num_prefill_tokens,num_decode_tokens\n5,3\n\xff\xfe,3\n")
    with pytest.raises(ArtifactError) as err:
        load_trace(path, 0, 4096, False)
    text = str(err.value)
    assert f"{path}, line 3: not UTF-8 text (byte 0xff)" in text
    assert "expected a trace CSV (num_prefill_tokens, num_decode_tokens" in text
    assert "codec" not in text


def test_binary_csv_and_json_artifacts_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "blob"
    path.write_bytes(BINARY)
    with pytest.raises(ArtifactError, match=rf"^{re.escape(str(path))}, line 1: not UTF-8.*"):
        read_csv(path, TRACE_LENGTHS)
    with pytest.raises(ArtifactError, match=r"expected table trace_lengths"):
        read_csv(path, TRACE_LENGTHS)
    with pytest.raises(ArtifactError, match=rf"^{re.escape(str(path))}, line 1: not UTF-8.*"):
        read_json(path)
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_bytes(b'{"request_id": 0}\n{"request_id": 1}\n' + BINARY)
    with pytest.raises(ArtifactError, match=rf"^{re.escape(str(jsonl))}, line 3: not UTF-8"):
        read_jsonl(jsonl)


def _workload_run(root: Path) -> Path:
    """A complete workload run of two requests, written through the contract layer."""
    with start_run(root, "workload", "w", {}) as run:
        write_csv(
            run.file(layout.TRACE_LENGTHS),
            pd.DataFrame(
                {"request_id": [0, 1], "num_prefill_tokens": [4, 5], "num_decode_tokens": [2, 3]}
            ),
            TRACE_LENGTHS,
        )
        (run.file(layout.TRACE_INTERVALS)).write_text(
            "request_id,arrival_time_s,inter_arrival_s\n0,0,0\n1,0.5,0.5\n"
        )
        write_json(run.file(layout.WORKLOAD_META), {"workload_id": "wl-x", "summary": {}})
    return run.path


@pytest.mark.parametrize(
    "name", [layout.WORKLOAD_META, layout.TRACE_LENGTHS, layout.TRACE_INTERVALS]
)
def test_binary_file_in_an_upstream_workload_run_is_named(tmp_path: Path, name: str) -> None:
    run = _workload_run(tmp_path)
    assert load_workload(run).lengths["num_prefill_tokens"].tolist() == [4, 5]
    (run / name).write_bytes(BINARY)
    with pytest.raises(ArtifactError, match=rf"^{re.escape(str(run / name))}, line 1: not UTF-8"):
        load_workload(run)


# --------------------------------------------------------------------------------------------
# Malformed CSV rows, numpy reprs, allowed values
# --------------------------------------------------------------------------------------------


def test_trace_row_with_an_extra_field_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,5,3\n0.5,10,5,7\n")
    with pytest.raises(ArtifactError) as err:
        load_trace(path, 0, 4096, False)
    text = str(err.value)
    assert text.startswith(f"{path}: not a valid CSV (Expected 3 fields in line 3, saw 4)")
    assert "Error tokenizing" not in text


def test_fractional_integer_is_shown_as_a_plain_number(tmp_path: Path) -> None:
    path = tmp_path / "trace_lengths.csv"
    path.write_text("request_id,num_prefill_tokens,num_decode_tokens\n0,10,5\n1,10.7,5\n")
    expected = "row 2, column 'num_prefill_tokens': expected an integer, got 10.7"
    with pytest.raises(ArtifactError) as err:
        read_csv(path, TRACE_LENGTHS)
    assert str(err.value) == f"{path}: {expected}"
    with pytest.raises(ArtifactError) as err:
        validate_frame(
            pd.DataFrame(
                {
                    "request_id": [0, 1],
                    "num_prefill_tokens": [10, 10.7],
                    "num_decode_tokens": [5, 5],
                }
            ),
            TRACE_LENGTHS,
        )
    assert expected in str(err.value) and "np." not in str(err.value)


def test_duplicate_id_is_shown_as_a_plain_number(tmp_path: Path) -> None:
    path = tmp_path / "trace_lengths.csv"
    path.write_text("request_id,num_prefill_tokens,num_decode_tokens\n0,10,5\n0,11,5\n")
    with pytest.raises(ArtifactError) as err:
        read_csv(path, TRACE_LENGTHS)
    assert str(err.value) == f"{path}: row 2, column 'request_id': duplicate value 0"


def _request_metrics_csv(path: Path, statuses: list[str]) -> Path:
    rows = [f"{i},{i * 0.5},4,2,0.1,0.05,0.15,{s}" for i, s in enumerate(statuses)]
    path.write_text(",".join(REQUEST_METRICS.column_names) + "\n" + "\n".join(rows) + "\n")
    return path


def test_unknown_request_status_is_rejected_naming_row_and_allowed_values(tmp_path: Path) -> None:
    path = _request_metrics_csv(tmp_path / "request_metrics.csv", ["ok", "error", "okk"])
    with pytest.raises(ArtifactError) as err:
        read_csv(path, REQUEST_METRICS)
    assert str(err.value) == (
        f"{path}: row 3, column 'status': 'okk' is not one of ok, error, timeout, cancelled"
    )
    frame = pd.read_csv(path)
    with pytest.raises(ArtifactError, match=r"row 3, column 'status': 'okk' is not one of"):
        write_csv(tmp_path / "out.csv", frame, REQUEST_METRICS)
    assert not (tmp_path / "out.csv").exists()


def test_a_row_cut_short_is_named_not_filled_with_empty_cells(tmp_path: Path) -> None:
    path = _request_metrics_csv(tmp_path / "request_metrics.csv", ["ok", "ok", "ok"])
    text = path.read_text()
    path.write_text(text[: text.rindex(",0.05,")] + "\n")  # the last row ends mid-way
    with pytest.raises(ArtifactError) as err:
        read_csv(path, REQUEST_METRICS)
    assert str(err.value).startswith(f"{path}, line 4: 5 fields, the header has 8")


def _compare_input(tmp_path: Path, statuses: list[str], num_requests: int) -> Path:
    with start_run(tmp_path, "vidur_simulate", "s", {}) as run:
        run.update_meta(workload_id="w", num_requests=num_requests)
        _request_metrics_csv(run.path / layout.REQUEST_METRICS, statuses)
    return run.path


def test_compare_refuses_a_table_that_lost_rows_or_an_ok_row_without_times(
    tmp_path: Path,
) -> None:
    from gpu_simulate_test.core.run_inputs import load_run

    assert (
        len(load_run(_compare_input(tmp_path / "a", ["ok"] * 3, 3), "vidur_simulate").requests) == 3
    )
    short = _compare_input(tmp_path / "b", ["ok"] * 3, 5)
    with pytest.raises(ArtifactError, match=r"3 rows, but run_meta\.json says the run had 5"):
        load_run(short, "vidur_simulate")
    blank = _compare_input(tmp_path / "c", ["ok"] * 3, 3)
    table = blank / layout.REQUEST_METRICS
    lines = table.read_text().splitlines()
    lines[2] = lines[2].replace(",0.1,0.05,", ",,0.05,")  # row 2: ttft_s emptied
    table.write_text("\n".join(lines) + "\n")
    with pytest.raises(ArtifactError, match=r"row 2, column 'ttft_s': empty, but .* status is ok"):
        load_run(blank, "vidur_simulate")


def test_every_request_status_the_producers_write_is_allowed(tmp_path: Path) -> None:
    from gpu_simulate_test.core.engines import records

    ended = {records.STATUS_OK, records.STATUS_ERROR, records.STATUS_TIMEOUT}
    assert ended | {records.STATUS_CANCELLED} == set(REQUEST_STATUSES)
    path = _request_metrics_csv(tmp_path / "request_metrics.csv", list(REQUEST_STATUSES))
    assert read_csv(path, REQUEST_METRICS)["status"].tolist() == list(REQUEST_STATUSES)


# --------------------------------------------------------------------------------------------
# Workload config keys
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["workload.output_len.min=100"],
            "workload.output_len.max (64) must be >= workload.output_len.min (100)",
        ),
        (["workload.prompt_len.min=0"], "workload.prompt_len.min must be >= 1, got 0"),
        (
            ["workload.output_len.kind=zipf", "workload.output_len.zipf_a=1"],
            "workload.output_len.zipf_a must be > 1",
        ),
        (["workload.arrival.burstiness=0"], "workload.arrival.burstiness must be > 0, got 0.0"),
        (["workload.seed=-1"], "workload.seed must be >= 0, got -1"),
        (["workload.trace_target_qps=5"], "workload.trace_target_qps=5 rescales a trace's"),
    ],
)
def test_workload_config_errors_name_the_full_key(
    compose_stage, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        to_typed(compose_stage("workload", overrides), WorkloadStageConfig)
    assert message in str(err.value)


# --------------------------------------------------------------------------------------------
# Run ids and unfinished runs
# --------------------------------------------------------------------------------------------


def test_default_run_id_is_unique_per_launch_readable_and_time_sorted() -> None:
    config = {"workload": {"num_requests": 3}}
    ids = [default_run_id(config) for _ in range(20)]
    assert len(set(ids)) == len(ids)
    for run_id in ids:
        assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{8}-[0-9a-f]{6}", run_id), run_id
        assert layout.validate_run_id(run_id) == run_id
    # the config id says which config ran
    assert len({run_id.split("-")[2] for run_id in ids}) == 1
    assert default_run_id({"other": 1}).split("-")[2] != ids[0].split("-")[2]


def test_complete_run_with_leftover_marker_says_so(tmp_path: Path) -> None:
    with start_run(tmp_path, "workload", "r", {}) as run:
        pass
    marker = run.path / layout.INCOMPLETE_MARKER
    marker.write_text("this run has not finished\n")
    with pytest.raises(ArtifactError) as err:
        open_upstream_run(run.path, "workload")
    text = str(err.value)
    assert f"the marker {marker} is still there" in text
    assert "interrupted while finishing, or is still being written" in text
    assert "status=complete" not in text and "not complete" not in text


# --------------------------------------------------------------------------------------------
# A workload run whose rows are not the ones its meta counts; a run of another schema
# --------------------------------------------------------------------------------------------


def _counted(path: Path, num_requests: int) -> None:
    write_json(path / layout.WORKLOAD_META, {"workload_id": "wl-x", "summary": {
        "num_requests": num_requests}})  # fmt: skip


def test_a_workload_with_headers_only_or_rows_cut_is_named(tmp_path: Path) -> None:
    path = _workload_run(tmp_path)
    _counted(path, 2)
    assert len(load_workload(path).lengths) == 2  # as its meta counts: read
    _counted(path, 3)
    with pytest.raises(ArtifactError) as err:
        load_workload(path)
    text = str(err.value)
    assert str(path / layout.TRACE_LENGTHS) in text and "2 rows" in text
    assert "'summary.num_requests' is 3" in text
    (path / layout.TRACE_LENGTHS).write_text("request_id,num_prefill_tokens,num_decode_tokens\n")
    (path / layout.TRACE_INTERVALS).write_text("request_id,arrival_time_s,inter_arrival_s\n")
    with pytest.raises(ArtifactError, match=r"trace_lengths.csv: no rows \(headers only\)"):
        load_workload(path)


def test_a_run_of_another_schema_version_is_refused(tmp_path: Path) -> None:
    path = _workload_run(tmp_path)
    meta = read_json(path / layout.RUN_META)
    write_json(path / layout.RUN_META, {**meta, "schema_version": "1.7"})
    open_upstream_run(path, "workload")  # the same major version: read
    write_json(path / layout.RUN_META, {**meta, "schema_version": "99.0"})
    with pytest.raises(ArtifactError) as err:
        open_upstream_run(path, "workload")
    text = str(err.value)
    assert str(path / layout.RUN_META) in text and "'schema_version' is '99.0'" in text
