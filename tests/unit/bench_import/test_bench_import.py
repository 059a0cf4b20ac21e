"""bench_import's readers and the vllm bench export on the real ``vllm bench serve`` output
(``tests/data/vllm/``: --save-result --save-detailed, 50 requests against a vLLM server)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpu_simulate_test.bench_import.contract import (
    VLLM_DETAILED_KEYS,
    VLLM_RESULT_HEADER_KEYS,
    VLLM_RESULT_KEYS,
)
from gpu_simulate_test.bench_import.export import vllm_result
from gpu_simulate_test.bench_import.guidellm import read_guidellm
from gpu_simulate_test.bench_import.imported import check_run
from gpu_simulate_test.bench_import.vllm_bench import load_results, read_vllm_bench
from gpu_simulate_test.bench_import.write import as_workload, request_table, token_table
from gpu_simulate_test.config.presets import model_preset
from gpu_simulate_test.io.artifacts import ArtifactError
from tests.conftest import REPO_ROOT

VLLM_FIXTURE = REPO_ROOT / "tests" / "data" / "vllm" / "vllm_bench_serve_q06b.json"
QWEN3_0_6B = model_preset("qwen3_0_6b")
SUMMARY_SAME = [  # every summary vLLM saved but the ones over its own duration (see below)
    "completed", "failed", "total_input_tokens", "total_output_tokens",
    "max_output_tokens_per_s", "max_concurrent_requests", "mean_ttft_ms", "median_ttft_ms",
    "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p99_itl_ms",
]  # fmt: skip


def fixture() -> dict[str, Any]:
    return json.loads(VLLM_FIXTURE.read_text())


def imported():
    [run] = read_vllm_bench(VLLM_FIXTURE, load_results(VLLM_FIXTURE))
    return run


def test_reads_every_request_and_confirms_vllms_conventions() -> None:
    data, run = fixture(), imported()
    assert run.num_requests == 50 and run.ok.all()
    assert run.ttft_s.tolist() == data["ttfts"] and run.e2e_s.tolist() == data["latencies"]
    assert [len(e) for e in run.event_offsets_s] == data["output_lens"]  # one token a chunk
    for name in ("ttft", "tpot", "itl", "e2e"):
        assert run.conventions[name]["checked"] and run.conventions[name]["agrees"], name
    assert "129.643" in run.conventions["tpot"]["note"]
    sampling = run.conventions["sampling"]  # not in the file: said, never claimed as checked
    assert not sampling["checked"] and "--temperature=0" in sampling["note"]
    check_run(run, QWEN3_0_6B)


def test_workload_and_tables_keep_arrivals_lengths_and_token_times() -> None:
    data, run = fixture(), imported()
    workload = as_workload(run)
    sent = np.asarray(data["start_times"])
    np.testing.assert_allclose(workload.arrival_time_s, sent - sent.min(), atol=1e-12)
    assert workload.num_prefill_tokens.tolist() == data["input_lens"]
    requests = request_table(run)
    np.testing.assert_allclose(requests["e2e_s"] - requests["ttft_s"], [
        sum(gaps) for gaps in data["itls"]
    ], atol=1e-9)  # fmt: skip
    tokens = token_table(run, requests)
    assert tokens is not None and len(tokens) == sum(data["output_lens"])
    last = tokens.groupby("request_id")["time_s"].max().to_numpy()
    np.testing.assert_allclose(last, requests["last_token_time_s"], atol=1e-9)


def test_export_is_the_fixture_key_for_key() -> None:
    """Imported and exported again: the same keys in vLLM's order, the same per-request lists
    and the same summaries (vLLM's duration also counts its start-up before the first send)."""
    data, run = fixture(), imported()
    requests = request_table(run)
    out = vllm_result(requests, token_table(run, requests), header={"backend": "vllm"})
    assert list(out) == list(data)
    assert tuple(out)[: len(VLLM_RESULT_HEADER_KEYS)] == VLLM_RESULT_HEADER_KEYS
    for key in ("input_lens", "output_lens", "ttfts", "latencies", "errors"):
        assert out[key] == pytest.approx(data[key]) if key != "errors" else out[key] == data[key]
    for mine, theirs in zip(out["itls"], data["itls"], strict=True):
        assert mine == pytest.approx(theirs, abs=1e-9)
    for key in SUMMARY_SAME:
        assert out[key] == pytest.approx(data[key], rel=1e-9), key
    assert 0 < data["duration"] - out["duration"] < 0.5
    for key in VLLM_RESULT_KEYS:
        assert type(out[key]) is type(data[key]) or data[key] is None, key


def test_export_matches_vllms_own_metric_routine() -> None:
    """The exported per-request fields through vLLM's ``calculate_metrics``: its summaries are
    the ones we wrote."""
    serve = pytest.importorskip("vllm.benchmarks.serve")
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput

    run = imported()
    requests = request_table(run)
    out = vllm_result(
        requests, token_table(run, requests), {"backend": "vllm"}, ("ttft", "tpot", "itl", "e2el"),
        (50, 90, 99),
    )  # fmt: skip
    outputs = [
        RequestFuncOutput(
            success=True,
            latency=lat,
            output_tokens=n,
            ttft=t,
            itl=list(gaps),
            prompt_len=p,
            start_time=s,
        )
        for lat, n, t, gaps, p, s in zip(
            out["latencies"],
            out["output_lens"],
            out["ttfts"],
            out["itls"],
            out["input_lens"],
            out["start_times"],
            strict=True,
        )
    ]
    metrics, _ = serve.calculate_metrics([], outputs, out["duration"], None, [50, 90, 99], {})
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert out[f"mean_{name}_ms"] == pytest.approx(getattr(metrics, f"mean_{name}_ms"))
        theirs = dict(getattr(metrics, f"percentiles_{name}_ms"))
        for p in (50, 90, 99):
            assert out[f"p{p}_{name}_ms"] == pytest.approx(theirs[p]), (name, p)
    assert out["max_output_tokens_per_s"] == metrics.max_output_tokens_per_s
    assert out["max_concurrent_requests"] == metrics.max_concurrent_requests
    assert out["output_throughput"] == pytest.approx(metrics.output_throughput)


def test_a_simulated_run_exports_tpot_as_its_itls() -> None:
    run = imported()
    requests = request_table(run)
    out = vllm_result(requests, None, {"backend": "vidur"})
    for gaps, ttft, e2e, n in zip(out["itls"], out["ttfts"], out["latencies"], out["output_lens"],
                                  strict=True):  # fmt: skip
        assert len(gaps) == n - 1 and ttft + sum(gaps) == pytest.approx(e2e)
    assert out["mean_tpot_ms"] == pytest.approx(fixture()["mean_tpot_ms"])


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "result.json"
    path.write_text(json.dumps(data))
    return path


def test_a_result_without_save_detailed_names_the_field_and_the_flag(tmp_path: Path) -> None:
    data = {k: v for k, v in fixture().items() if k not in VLLM_DETAILED_KEYS}
    path = _write(tmp_path, data)
    with pytest.raises(ArtifactError) as err:
        read_vllm_bench(path, load_results(path))
    message = str(err.value)
    assert str(path) in message and "'input_lens'" in message and "--save-detailed" in message


def test_a_list_of_the_wrong_length_is_named(tmp_path: Path) -> None:
    data = fixture()
    data["ttfts"] = data["ttfts"][:-1]
    path = _write(tmp_path, data)
    with pytest.raises(ArtifactError, match=r"field 'ttfts' has 49 entries, expected a list of 50"):
        read_vllm_bench(path, load_results(path))


def test_lengths_the_model_cannot_serve_are_refused() -> None:
    small = replace(QWEN3_0_6B, max_position_embeddings=150)
    with pytest.raises(ArtifactError) as err:
        check_run(imported(), small)
    message = str(err.value)
    assert str(VLLM_FIXTURE) in message and "'input_lens'" in message
    assert "128 prompt + 32 output tokens" in message and "model=" in message


def test_failed_requests_are_left_out_and_appended_results_are_runs(tmp_path: Path) -> None:
    data = fixture()
    data["errors"][3] = "ClientConnectorError"
    data["output_lens"][3] = 0
    path = tmp_path / "appended.json"
    path.write_text(json.dumps(fixture()) + "\n" + json.dumps(data) + "\n")
    runs = read_vllm_bench(path, load_results(path))
    assert [r.label for r in runs] == ["result 0", "result 1"]
    assert runs[0].ok.all() and not runs[1].ok[3] and runs[1].ok.sum() == 49
    assert len(request_table(runs[1])) == 49


GUIDELLM_FIXTURE = REPO_ROOT / "tests" / "data" / "guidellm" / "guidellm_benchmarks_tiny.json"


def guidellm_report() -> dict[str, Any]:
    return json.loads(GUIDELLM_FIXTURE.read_text())


def test_guidellm_benchmarks_are_runs_with_their_conventions_checked() -> None:
    report = guidellm_report()
    runs = read_guidellm(GUIDELLM_FIXTURE, report)
    assert [r.label for r in runs] == ["benchmark 0 (poisson@2)", "benchmark 1 (poisson@4)"]
    for run, bench in zip(runs, report["benchmarks"], strict=True):
        check_run(run, model_preset("qwen3_tiny"))
        assert run.ok.all() and run.num_requests == len(bench["requests"]["successful"])
        for name in ("ttft", "tpot", "guidellm_tpot"):
            assert run.conventions[name]["agrees"], (name, run.conventions[name])
        assert not run.conventions["itl"]["checked"]
        # GuideLLM's own TPOT counts the first token: it is not vLLM's, and the import keeps vLLM's
        requests = request_table(run)
        stats = bench["requests"]["successful"]
        for _, row in requests.iterrows():
            saved = stats[int(row["source_index"])]
            assert row["tpot_s"] * 1e3 == pytest.approx(saved["inter_token_latency_ms"])
            assert row["ttft_s"] * 1e3 == pytest.approx(saved["time_to_first_token_ms"])
            assert row["tpot_s"] * 1e3 != pytest.approx(saved["time_per_output_token_ms"])
        assert token_table(run, requests) is None
        assert (requests["arrival_error_s"] > 0).all()  # GuideLLM sends a few ms late


def test_a_guidellm_report_of_another_version_names_the_field() -> None:
    report = guidellm_report()
    report["metadata"] = {"version": 1, "guidellm_version": "0.3.1"}
    with pytest.raises(ArtifactError) as err:
        read_guidellm(GUIDELLM_FIXTURE, report)
    message = str(err.value)
    assert str(GUIDELLM_FIXTURE) in message and "'metadata.version' is 1" in message
    assert "0.3.1" in message and "guidellm 0.8" in message


def test_a_guidellm_request_without_token_times_names_the_request() -> None:
    report = guidellm_report()
    del report["benchmarks"][1]["requests"]["successful"][4]["info"]["timings"][
        "first_token_iteration"
    ]
    with pytest.raises(ArtifactError, match=r"benchmark 1 .*successful\[4\]\.info\.timings\.first"):
        read_guidellm(GUIDELLM_FIXTURE, report)


def test_an_imported_run_is_dated_by_its_benchmark_not_the_import(tmp_path: Path) -> None:
    from gpu_simulate_test.bench_import.write import write_imported_truth
    from gpu_simulate_test.io.runs import start_run

    guidellm_runs = read_guidellm(GUIDELLM_FIXTURE, guidellm_report())
    start = guidellm_report()["benchmarks"][1]["start_time"]
    for name, run, date, said in (
        ("vllm", imported(), fixture()["date"], "the vllm_bench_serve file's date"),
        (
            "guidellm",
            guidellm_runs[1],
            datetime.fromtimestamp(start, UTC).strftime("%Y%m%d-%H%M%S"),
            "the guidellm file's start_time (UTC)",
        ),
        ("undated", replace(imported(), settings={}), None, "the import's clock"),
    ):
        with start_run(tmp_path, "real_bench", name, {}) as out:
            summary = write_imported_truth(out, run, "w", "wl-x")
        assert json.loads((out.path / "summary.json").read_text()) == summary
        if date is not None:
            assert summary["date"] == date, name
        else:  # the file has none: the import's own clock, said so
            assert re.fullmatch(r"\d{8}-\d{6}", summary["date"])
        assert summary["date_from"].startswith(said), name


def test_an_export_s_request_rate_is_the_rate_the_workload_was_told() -> None:
    """``vllm bench serve``'s ``request_rate`` is ``--request-rate``: a workload told 4 req/s
    exported the 3.365 its 40 arrivals realized."""
    from gpu_simulate_test.core.traffic.workloads import told_rate

    summary = {"mean_qps": 3.365}
    synthetic = {"generator": {"source": "synthetic", "qps": 4.0}, "summary": summary}
    assert told_rate(synthetic) == 4.0
    chat = {"generator": {"source": "synthetic", "qps": 1.0, "session": {"enabled": True}},
            "summary": summary}  # fmt: skip
    assert told_rate(chat) == 3.365  # its qps counts sessions, not requests
    at_once = {"generator": {"source": "synthetic", "qps": float("inf")}, "summary": summary}
    assert told_rate(at_once) == 3.365
    rescaled = {"generator": {"source": "trace", "trace_target_qps": 5.0}, "summary": summary}
    assert told_rate(rescaled) == 5.0
    assert told_rate({"generator": {"source": "trace"}, "summary": summary}) == 3.365
    assert told_rate({}) is None


def test_an_export_is_dated_by_the_run_not_the_export(tmp_path: Path) -> None:
    """An imported run exported back keeps the benchmark's ``date``; a run without a dated
    summary (a simulation) is dated by its start, never by the export's clock."""
    from gpu_simulate_test.bench_import.stage import export_run, run, run_date
    from gpu_simulate_test.config.bench_import import BenchImportStageConfig
    from gpu_simulate_test.config.presets import hardware_preset
    from gpu_simulate_test.config.schema import OutputConfig

    cfg = BenchImportStageConfig(
        source=str(VLLM_FIXTURE),
        model=QWEN3_0_6B,
        hardware=hardware_preset("h100"),
        output=OutputConfig(root=str(tmp_path), run_id="v"),
        progress=False,
    )
    run(cfg, {})
    exported = export_run(tmp_path / "real_bench" / "v", ("ttft",), (99,))
    assert exported["date"] == fixture()["date"] == "20261123-142548"
    # the file's own header, not the import's stand-ins ("vllm_bench_serve", the model
    # config's hf_name, the 3.98 req/s the imported arrivals realized for a told 4)
    for key in ("endpoint_type", "backend", "model_id", "tokenizer_id", "request_rate"):
        assert exported[key] == fixture()[key], key
    undated = tmp_path / "sim"
    undated.mkdir()
    assert run_date(undated, {"start_time": "2026-11-30T23:59:58.5+01:00"}) == "20261130-225958"
    assert run_date(undated, {}) is None
