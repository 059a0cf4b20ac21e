"""The compare stage through its CLI on hand-built run directories: output, bad input, sweeps."""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.compare.sweep import run_sweep
from gpu_simulate_test.config.compare import CompareStageConfig
from gpu_simulate_test.config.schema import OutputConfig
from gpu_simulate_test.io.artifacts import read_json, write_csv
from gpu_simulate_test.io.runs import start_run
from gpu_simulate_test.io.schemas import REQUEST_METRICS
from tests.conftest import run_cli

pytestmark = pytest.mark.integration
N = 30


def make_run(
    root: Path,
    stage: str,
    run_id: str,
    workload_id: str = "wl-test",
    scale: float = 1.0,
    qps: float = 2.0,
    statuses: dict[int, str] | None = None,
    fail: bool = False,
    engine_stamps: bool = False,
) -> Path:
    """A finished run of ``stage`` with a request table whose latencies grow with prompt length;
    ``engine_stamps``: with hf_cb's stamps of each first token (the client's send and receipt,
    the engine's queueing 0.05 ms after the send and its first token 0.4 ms before the
    receipt)."""
    rng = np.random.default_rng(0)
    prompt = rng.integers(16, 256, N)
    decode = rng.integers(2, 40, N)
    arrival = np.arange(N) / qps
    ttft = scale * (0.01 + prompt * 1e-4)
    tpot = scale * np.full(N, 0.02)
    e2e = ttft + tpot * (decode - 1)
    status = [(statuses or {}).get(i, "ok") for i in range(N)]
    frame = pd.DataFrame(
        {
            "request_id": range(N),
            "arrival_time_s": arrival,
            "num_prefill_tokens": prompt,
            "num_decode_tokens": decode,
            "ttft_s": [t if s == "ok" else np.nan for t, s in zip(ttft, status, strict=True)],
            "tpot_s": tpot,
            "e2e_s": [t if s == "ok" else np.nan for t, s in zip(e2e, status, strict=True)],
            "status": status,
        }
    )
    if engine_stamps:
        frame["first_token_time_s"] = arrival + frame["ttft_s"]
        frame["engine_arrival_time_s"] = arrival + 5e-5
        frame["engine_first_token_time_s"] = frame["first_token_time_s"] - 4e-4
    config: dict[str, dict[str, object]] = {
        "model": {"name": "qwen3_tiny"},
        "hardware": {"name": "cpu"},
    }
    if stage == "real_bench":
        config["backend"] = {"name": "hf_cb", "max_batch_tokens": 256, "max_requests_per_batch": 32,
                             "block_size": 16, "num_blocks": 512}  # fmt: skip
    with (
        pytest.raises(RuntimeError) if fail else contextlib.nullcontext(),
        start_run(root, stage, run_id, config) as r,
    ):
        r.update_meta(workload_id=workload_id)
        if stage == "vidur_simulate":
            r.update_meta(scheduler={"name": "sarathi", "chunk_size": 256, "batch_size_cap": 32,
                                     "block_size": 16}, num_blocks=512)  # fmt: skip
        write_csv(r.file("request_metrics.csv"), frame, REQUEST_METRICS)
        if fail:
            raise RuntimeError("engine died")
    return root / stage / run_id


def test_compare_writes_tables_plots_and_summary(tmp_path: Path) -> None:
    real = make_run(tmp_path / "tmp", "real_bench", "r", statuses={3: "error", 7: "timeout"},
                    engine_stamps=True)  # fmt: skip
    sim = make_run(tmp_path / "tmp", "vidur_simulate", "s", scale=0.77)
    proc = run_cli("compare", f"real_run_dir={real}", f"sim_run_dir={sim}", "output.run_id=c",
                   "goodput.e2el=1e9", cwd=tmp_path)  # fmt: skip
    assert "TTFT" in proc.stdout and "-23.0%" in proc.stdout
    out = tmp_path / "tmp" / "compare" / "c"
    data = json.loads((out / "comparison.json").read_text())
    assert data["num_compared"] == N - 2
    assert [e["request_id"] for e in data["excluded"]] == [3, 7]
    assert data["metrics"]["ttft"]["errors"]["p90"]["signed"] == pytest.approx(-0.23)
    assert data["metrics"]["e2e"]["per_request_error"]["mean"] == pytest.approx(-0.23)
    # every request meets a goal of 1e9 ms: goodput is the throughput of each side
    good = data["goodput"]
    assert good["goals_ms"] == {"e2el": 1e9} and good["real"]["good_requests"] == N - 2
    for side in ("real", "sim"):
        rate = data["throughput"][side]["requests_per_s"]
        assert good[side]["request_goodput"] == pytest.approx(rate)
    assert "goodput (e2el:1e+09 ms)" in proc.stdout
    summary = (out / "summary.md").read_text()
    assert "simulated TTFT p90 is 23% low" in summary
    assert "2 request(s) not ok on both sides were left out" in summary
    assert "## Goodput" in summary
    assert "![CDFs, real vs simulated](cdf.png)" in summary
    for name in ("cdf.png", "scatter.png", "error_by_length.png"):
        png = (out / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert len(pd.read_csv(out / "requests.csv")) == N - 2
    # hf_cb has no API server: its own stamps split each first token into three hops
    assert not (real / "front_end_stamps.csv").exists()
    parts = data["ttft_parts"]
    assert parts["source"] == "in_process" and parts["requests"] == N - 2
    assert [h["hop"] for h in parts["hops"]] == ["client → engine queued",
        "engine (queue + first token)", "engine → client"]  # fmt: skip
    assert [h["p50"] for h in parts["hops"]][::2] == [pytest.approx(0.05), pytest.approx(0.4)]
    assert sum(h["mean"] for h in parts["hops"]) == pytest.approx(  # ms, the metrics in s
        1e3 * data["metrics"]["ttft"]["real"]["mean"]
    )
    assert "*Source:* an in-process engine's own stamps" in summary
    assert (out / "ttft_parts.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("real_kwargs", "message"),
    [
        ({"workload_id": "wl-other"}, "different workloads"),
        ({"fail": True}, "run is not complete (status=failed)"),
        ({"workload_id": "wl-other", "repeat": True}, "/rr replayed wl-other"),
    ],
    ids=["different-workload", "failed-run", "repeat-of-another-workload"],
)
def test_bad_input_exits_2(tmp_path: Path, real_kwargs: dict, message: str) -> None:
    repeat = real_kwargs.pop("repeat", False)
    real = make_run(tmp_path / "tmp", "real_bench", "r", **({} if repeat else real_kwargs))
    sim = make_run(tmp_path / "tmp", "vidur_simulate", "s")
    more = [f"real_repeat_dir={make_run(tmp_path / 'tmp', 'real_bench', 'rr', **real_kwargs)}"]
    proc = run_cli("compare", f"real_run_dir={real}", f"sim_run_dir={sim}",
                   *(more if repeat else []), cwd=tmp_path, check=False)  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert message in " ".join(proc.stdout.split())
    assert not (tmp_path / "tmp" / "compare").exists()


def test_missing_sim_dir_is_a_config_error(tmp_path: Path) -> None:
    proc = run_cli("compare", "real_run_dir=x", cwd=tmp_path, check=False)
    assert proc.returncode == 2 and "sim_run_dir are required" in proc.stdout


def test_sweep_report_over_three_loads(tmp_path: Path) -> None:
    root = tmp_path / "tmp"
    for i, (qps, scale) in enumerate(((1.0, 0.9), (2.0, 0.8), (4.0, 0.7))):
        real = make_run(root, "real_bench", f"r{i}", workload_id=f"wl-{i}", qps=qps)
        sim = make_run(root, "vidur_simulate", f"s{i}", workload_id=f"wl-{i}", qps=qps, scale=scale)
        run_cli("compare", f"real_run_dir={real}", f"sim_run_dir={sim}", f"output.run_id=q-{i}",
                "compare.plots=false", "progress=false", cwd=tmp_path)  # fmt: skip
    proc = run_cli("compare", f"sweep_dirs=[{root}/compare/q-*]", "output.run_id=sweep",
                   cwd=tmp_path)  # fmt: skip
    assert "sweep of 3 compare runs" in proc.stdout
    out = root / "compare" / "sweep"
    table = pd.read_csv(out / "sweep.csv")
    ttft_p90 = table[(table["metric"] == "ttft") & (table["stat"] == "p90")]
    assert ttft_p90["load"].tolist() == pytest.approx([1.0, 2.0, 4.0])
    assert ttft_p90["signed_rel_error"].tolist() == pytest.approx([-0.1, -0.2, -0.3])
    assert (out / "sweep_latency_vs_load.png").stat().st_size > 20_000
    md = (out / "sweep.md").read_text()
    assert "latency vs offered load" in md and "| offered load | run |" in md
    assert "| ttft | p90 | 2 | `q-1` |" in md  # every row names its run

    # two runs at one x, or a sweep report named as a run: refused, nothing written
    shutil.copytree(root / "compare" / "q-0", root / "compare" / "q-dup")
    for dirs, message in (
        (f"[{root}/compare/q-0,{root}/compare/q-dup]", "both have offered_qps=1"),
        (f"[{root}/compare/q-0,{root}/compare/sweep]", "is a sweep report, not a compare run"),
    ):
        proc = run_cli("compare", f"sweep_dirs={dirs}", "output.run_id=bad-sweep", cwd=tmp_path,
                       check=False)  # fmt: skip
        assert proc.returncode == 2 and message in proc.stdout, proc.stdout
        assert not (root / "compare" / "bad-sweep").exists()
    # a sweep written over one of its own runs: refused, that run kept
    mine = ",".join(f"{root}/compare/q-{i}" for i in range(3))
    proc = run_cli("compare", f"sweep_dirs=[{mine}]", "output.run_id=q-2",
                   "output.overwrite=true", cwd=tmp_path, check=False)  # fmt: skip
    assert proc.returncode == 2 and "holds this run's own input" in " ".join(proc.stdout.split())
    assert read_json(root / "compare" / "q-2" / "run_meta.json").get("kind") != "sweep"
    # a pipeline multirun over another knob (same load in every job): the jobs in order instead
    ordered = run_sweep(
        CompareStageConfig(
            sweep_dirs=(str(root / "compare" / "q-0"), str(root / "compare" / "q-dup")),
            output=OutputConfig(root=str(root), run_id="ordered"),
            progress=False,
        ),
        {},
        order_if_shared=True,
    )
    assert pd.read_csv(ordered / "sweep.csv")["load"].unique().tolist() == [0, 1]
    assert read_json(ordered / "run_meta.json")["sweep_x"] == "run"


def test_replaced_runs_must_be_real_runs(tmp_path: Path) -> None:
    real = make_run(tmp_path / "tmp", "real_bench", "r")
    sim = make_run(tmp_path / "tmp", "vidur_simulate", "s")
    for replaced, message in (
        (tmp_path / "none", "does not exist"),
        (sim, "is a vidur_simulate run"),
    ):
        proc = run_cli("compare", f"real_run_dir={real}", f"sim_run_dir={sim}",
                       f"replaced_runs=[{replaced}]", cwd=tmp_path, check=False)  # fmt: skip
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert f"replaced_runs: {replaced} {message}" in " ".join(proc.stdout.split())
    earlier = make_run(tmp_path / "tmp", "real_bench", "r-rerun0")
    run_cli("compare", f"real_run_dir={real}", f"sim_run_dir={sim}", f"replaced_runs=[{earlier}]",
            "compare.plots=false", cwd=tmp_path)  # fmt: skip


def test_a_warm_up_left_out_is_left_out_of_the_throughput_s_window(tmp_path: Path) -> None:
    """``compare.warmup_s``: the requests of the run's first seconds are out of every figure,
    the throughput's duration too (it ran from time 0, reading the kept requests as slower)."""
    real = make_run(tmp_path / "tmp", "real_bench", "r")
    sim = make_run(tmp_path / "tmp", "vidur_simulate", "s", scale=0.9)
    run_cli("compare", f"real_run_dir={real}", f"sim_run_dir={sim}", "output.run_id=w",
            "compare.warmup_s=5", cwd=tmp_path)  # fmt: skip
    data = json.loads((tmp_path / "tmp" / "compare" / "w" / "comparison.json").read_text())
    assert data["num_compared"] == N - 10  # arrivals 0, 0.5, ... 4.5 s left out
    frame = pd.read_csv(real / "request_metrics.csv")
    last = float((frame["arrival_time_s"] + frame["e2e_s"]).max())
    measured = data["throughput"]["real"]
    assert measured["duration_s"] == pytest.approx(last - 5.0)
    assert measured["requests_per_s"] == pytest.approx((N - 10) / (last - 5.0))
