"""Malformed GuideLLM reports and exports: each fails naming the file and the field, not with a
Python error from deep inside the reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpu_simulate_test.bench_import.guidellm import read_guidellm
from gpu_simulate_test.bench_import.imported import check_run
from gpu_simulate_test.bench_import.stage import read_source, run_export
from gpu_simulate_test.bench_import.vllm_bench import read_vllm_bench
from gpu_simulate_test.config.bench_import import BenchImportStageConfig
from gpu_simulate_test.config.presets import model_preset
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.io.artifacts import ArtifactError
from tests.conftest import REPO_ROOT

VLLM_FIXTURE = REPO_ROOT / "tests" / "data" / "vllm" / "vllm_bench_serve_q06b.json"
GUIDELLM_FIXTURE = REPO_ROOT / "tests" / "data" / "guidellm" / "guidellm_benchmarks_tiny.json"


def report() -> dict[str, Any]:
    return json.loads(GUIDELLM_FIXTURE.read_text())


def test_a_rate_that_is_not_a_number_is_read_as_written() -> None:
    data = report()
    data["benchmarks"][0]["config"]["strategy"]["rate"] = "fast"
    data["benchmarks"][1]["config"] = [1]  # no strategy to read: unknown, not an error
    runs = read_guidellm(GUIDELLM_FIXTURE, data)
    assert [r.label for r in runs] == ["benchmark 0 (poisson@fast)", "benchmark 1 (?)"]


@pytest.mark.parametrize(
    ("where", "expected"),
    [("benchmark", r"field 'benchmarks\[1\]' is str, expected an object"),
     ("request", r"benchmark 0 .*field 'requests.successful\[1\]': 'oops', expected an object")],
)  # fmt: skip
def test_an_entry_that_is_not_an_object_is_named(where: str, expected: str) -> None:
    data = report()
    if where == "benchmark":
        data["benchmarks"][1] = "x"
    else:
        data["benchmarks"][0]["requests"]["successful"][1] = "oops"
    with pytest.raises(ArtifactError, match=expected):
        read_guidellm(GUIDELLM_FIXTURE, data)


def test_an_export_of_no_run_names_export_from_first(tmp_path: Path) -> None:
    cfg = BenchImportStageConfig(export_from=str(tmp_path / "nope"))
    with pytest.raises(ArtifactError) as err:
        run_export(cfg, {})
    assert str(err.value).startswith(f"export_from={tmp_path / 'nope'}: not a run directory")


def test_a_source_that_is_a_directory_says_so(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"source=.*: a directory; expected a result file"):
        read_source(BenchImportStageConfig(source=str(tmp_path)))
    with pytest.raises(ArtifactError, match=r"source=.*: no such file; expected a result file"):
        read_source(BenchImportStageConfig(source=str(tmp_path / "none.json")))


@pytest.mark.filterwarnings("error")  # a numpy warning over no requests would fail here
def test_a_file_of_failed_requests_reads_quietly_and_is_refused() -> None:
    data = report()
    for bench in data["benchmarks"]:
        bench["requests"]["errored"] = bench["requests"]["successful"]
        bench["requests"]["successful"] = []
    runs = read_guidellm(GUIDELLM_FIXTURE, data)
    vllm = json.loads(VLLM_FIXTURE.read_text())
    vllm["errors"] = ["ClientConnectorError"] * len(vllm["errors"])
    runs += read_vllm_bench(VLLM_FIXTURE, [vllm])
    for run, field in zip(runs, ["requests.successful"] * 2 + ["errors"], strict=True):
        assert not run.ok.any()
        with pytest.raises(ArtifactError, match=rf"field '{field}'.*no request succeeded"):
            check_run(run, model_preset("qwen3_0_6b"))


@pytest.mark.parametrize(
    ("tool", "spoil", "expected"),
    [("guidellm", "last", r"'requests.successful\[3\].info.timings.last_token_iteration': "
      r"request 3 \(0-based\) has latency -"),
     ("guidellm", "first", r"'requests.successful\[3\].info.timings.first_token_iteration': "
      r"request 3 \(0-based\) has ttft -"),
     ("guidellm", "prompt", r"'requests.successful\[3\].prompt_tokens': request 3 \(0-based\) "
      r"has 0 tokens"),
     ("vllm", "ttft", r"field 'ttfts': request 3 \(0-based\) has ttft -1,"),
     ("vllm", "latency", r"field 'latencies': request 3 ends")],
)  # fmt: skip
def test_a_check_names_the_field_as_the_tool_wrote_it(tool: str, spoil: str, expected: str) -> None:
    """A request the checks refuse is named by the field its file holds (GuideLLM has no
    'latency' or 'input_lens'; vLLM's lists are 'ttfts' and 'latencies')."""
    if tool == "guidellm":
        data = report()
        request = data["benchmarks"][0]["requests"]["successful"][3]
        timings = request["info"]["timings"]
        if spoil == "prompt":
            request["prompt_tokens"] = 0
        else:
            key = f"{spoil}_token_iteration"
            timings[key] = timings["request_start"] - 1.0
        run = read_guidellm(GUIDELLM_FIXTURE, data)[0]
    else:
        vllm = json.loads(VLLM_FIXTURE.read_text())
        if spoil == "ttft":
            vllm["ttfts"][3] = -1.0
        else:
            vllm["latencies"][3] = vllm["ttfts"][3] / 2
        run = read_vllm_bench(VLLM_FIXTURE, [vllm])[0]
    with pytest.raises(ArtifactError, match=expected):
        check_run(run, model_preset("qwen3_0_6b"))


@pytest.mark.parametrize("key", ["request_start", "targeted_start"])
def test_a_time_that_is_not_finite_names_guidellms_field(key: str) -> None:
    data = report()
    data["benchmarks"][0]["requests"]["successful"][2]["info"]["timings"][key] = float("nan")
    with pytest.raises(ArtifactError, match=rf"successful\[2\]\.info\.timings\.{key}': nan"):
        read_guidellm(GUIDELLM_FIXTURE, data)


def test_a_run_named_twice_in_benchmarks_is_refused() -> None:
    """``benchmarks=[0,0]`` imported benchmark 0 twice, as two runs ``<id>-0`` and ``<id>-1``."""
    with pytest.raises(ConfigError, match=r"benchmarks=\[0, 0\] names a run more than once"):
        BenchImportStageConfig(source=str(GUIDELLM_FIXTURE), benchmarks=(0, 0))


@pytest.mark.parametrize("errors", ["ClientConnectorError", {"0": "x"}])
def test_errors_that_are_not_a_list_are_named(errors: object) -> None:
    """A string's letters were read as one error a request ('has 20 entries, expected 50')."""
    vllm = json.loads(VLLM_FIXTURE.read_text())
    vllm["errors"] = errors
    kind = type(errors).__name__
    with pytest.raises(ArtifactError, match=rf"field 'errors' is {kind}, expected a list of 50"):
        read_vllm_bench(VLLM_FIXTURE, [vllm])
