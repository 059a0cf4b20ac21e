"""The capacity stage on multi-turn workloads (simulated only; no engine): its rate is sessions/s
everywhere it is shown, each rate is also given in requests and concurrent users, a rate scales
only the sessions' turn 0 (their think times and closed loop untouched), and a backend without a
closed loop is refused before anything runs when the real engine would replay the sessions."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.capacity import contract
from gpu_simulate_test.capacity.sessions import STEADY_SESSIONS
from gpu_simulate_test.capacity.stage import at_rate
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_csv
from tests.conftest import run_cli
from tests.vidur_bundle_factory import (
    SyntheticRanges,
    synthetic_inputs,
    write_synthetic_bundle,
)

pytestmark = pytest.mark.integration

BLOCK = 32
"""backend=vllm's block size: the synthetic bundle is written for it, so that none is profiled
(and no engine served for a calibration)."""
SEARCH = (
    "backend=vllm", "engine_overhead=false", "profiling_root=profiles",
    "capacity.slo.ttft_ms=3", "capacity.slo.tpot_ms=0", "capacity.qps_min=1",
    "capacity.qps_max=10000", "capacity.points=9", "capacity.refine=4",
    "vidur.predictor.num_training_job_threads=1",
)  # fmt: skip
"""The synthetic bundle's steps take well under a millisecond: a 3 ms TTFT goal puts the knee
inside the grid."""
SHORT_THINK = ("workload.session.think_time.min_s=0.001", "workload.session.think_time.max_s=0.005")
"""Think times far shorter than the arrivals' span: 200 sessions arrive over more than
:data:`STEADY_SESSIONS` mean sessions at the capacity, a steady state."""


def _run(root: Path) -> Path:
    return root / "tmp" / "capacity"


def _doc(run: Path) -> dict[str, Any]:
    return json.loads((run / contract.CAPACITY_JSON).read_text())


@pytest.fixture(scope="module")
def project(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, subprocess.CompletedProcess]:
    """Three simulated searches over one synthetic bundle: ``mt``, the brief's command (the
    multi_turn workload, 32 sessions thinking 0.5-2 s, prefix caching on, the step band);
    ``steady``, 200 sessions with short think times, and ``single``, the same requests' lengths as
    a single-turn trace, both without prefix caching (the same work per request)."""
    root = tmp_path_factory.mktemp("capacity_sessions")
    write_synthetic_bundle(root / "profiles", ranges=SyntheticRanges(block_size=BLOCK))
    proc = run_cli(
        "capacity", "workload=multi_turn", "workload.num_requests=32", *SEARCH,
        "backend.enable_prefix_caching=true",
        "output.run_id=mt", cwd=root,
    )  # fmt: skip
    run_cli(
        "capacity", "workload=multi_turn", "workload.num_requests=200", *SHORT_THINK, *SEARCH,
        "capacity.step_band=0", "output.run_id=steady", "progress=false", cwd=root,
    )  # fmt: skip
    steady_workload = _run(root) / "steady" / "runs" / "workload" / "base"
    lengths = pd.read_csv(steady_workload / layout.TRACE_LENGTHS)
    lengths[["num_prefill_tokens", "num_decode_tokens"]].to_csv(root / "single.csv", index=False)
    run_cli(
        "capacity", "workload=trace", "workload.trace_file=single.csv", *SEARCH,
        "capacity.step_band=0", "output.run_id=single", "progress=false", cwd=root,
    )  # fmt: skip
    return root, proc


def test_a_multi_turn_search_says_sessions_per_second(
    project: tuple[Path, subprocess.CompletedProcess],
) -> None:
    root, proc = project
    run = _run(root) / "mt"
    doc = _doc(run)
    answer = doc["answer_qps"]
    assert doc["rate_unit"] == "sessions/s" and answer is not None
    sessions = doc["sessions"]
    assert sessions["num_sessions"] == 32 and doc["num_requests"] > 64  # 2-4 turns each
    load = sessions["at_answer"]
    # Little's law: sessions/s x the mean session's duration
    assert load["concurrent_users"] == pytest.approx(answer * load["mean_session_s"], rel=1e-3)
    assert load["mean_session_s"] > 1.0  # two turns or more, 0.5-2 s of thinking between them
    assert load["request_rate_per_s"] > 0
    # 32 sessions arriving within a few sessions' durations: the report says it is no steady state
    assert load["steady"] is False
    curve = read_csv(run / contract.CAPACITY_CSV, contract.CAPACITY_TABLE)
    assert curve["concurrent_users"].to_numpy() == pytest.approx(
        curve["qps"].to_numpy() * curve["mean_session_s"].to_numpy(), rel=1e-9
    )
    report = (run / contract.REPORT_MD).read_text()
    assert f"**Highest rate within the goals: {answer:g} sessions/s (≈ " in report
    assert "concurrent users" in report and "Not a steady state" in report
    assert "| sessions/s | phase |" in report and "32 sessions (" in report
    assert "answer would be" in report and "sessions/s;" in report  # the band's answers
    # req/s is left only where requests are counted: goodput and the requests finished
    rest = report.replace("goodput (req/s)", "").replace("req/s finished", "")
    assert "req/s" not in rest, rest
    out = proc.stdout
    assert "answer (sessions/s)" in out and "concurrent users at the answer" in out
    assert "answer with steps ±10% (sessions/s)" in out and "answer (req/s)" not in out
    assert (run / contract.CAPACITY_PLOT).stat().st_size > 20_000


def test_a_rate_scales_turn_0_alone_and_keeps_the_think_times(
    project: tuple[Path, subprocess.CompletedProcess], compose_stage: Any
) -> None:
    """Every rate the search simulated: each session's turn 0 reached the engine at the base
    workload's arrival / the rate, each later turn its think time after the previous turn ended
    (no front end here: engine_overhead=false), the think times the workload drew."""
    root, _ = project
    run = _run(root) / "mt"
    base = run / "runs" / "workload" / "base"
    lengths = pd.read_csv(base / layout.TRACE_LENGTHS)
    arrivals = pd.read_csv(base / layout.TRACE_INTERVALS)["arrival_time_s"].to_numpy()
    turn, think = lengths["turn"].to_numpy(), lengths["think_time_s"].to_numpy()
    assert np.isnan(arrivals[turn > 0]).all() and not np.isnan(arrivals[turn == 0]).any()
    rates = read_csv(run / contract.CAPACITY_CSV, contract.CAPACITY_TABLE)["qps"].tolist()
    assert len(rates) >= 9 and max(rates) / min(rates) > 1000
    for qps in rates:
        raw = pd.read_csv(run / contract.POINTS_DIR / f"{qps:g}" / "request_metrics.csv")
        raw = raw.sort_values("Request Id")
        sent = raw["arrived_at"].to_numpy()
        ended = sent + raw["request_e2e_time"].to_numpy()
        assert sent[turn == 0] == pytest.approx(arrivals[turn == 0] / qps, abs=1e-9)
        gaps = sent[1:] - ended[:-1]  # a later turn: after the previous row, its session's
        assert gaps[turn[1:] > 0] == pytest.approx(think[1:][turn[1:] > 0], abs=1e-9), qps
    # in memory: the scaled arrivals keep their NaN, the closed loop its think times
    inputs = synthetic_inputs(compose_stage, base, root / "profiles", BLOCK)
    scaled = at_rate(inputs, 8.0)
    assert np.array_equal(np.isnan(scaled.arrival_time_s), turn > 0)
    assert scaled.arrival_time_s[turn == 0] == pytest.approx(arrivals[turn == 0] / 8.0)
    assert scaled.after is inputs.after and inputs.after is not None
    assert [gap for _, gap in inputs.after if gap] == pytest.approx(think[turn > 0].tolist())


def test_sessions_per_second_stay_below_the_single_turn_capacity(
    project: tuple[Path, subprocess.CompletedProcess],
) -> None:
    """A sanity bound, not a timing: a session sends two to four requests of the same lengths as
    the single-turn trace's (no prefix cache: the same work each), so in a steady state it
    sustains fewer sessions/s than that trace requests/s (about 3x fewer here)."""
    root, _ = project
    steady, single = _doc(_run(root) / "steady"), _doc(_run(root) / "single")
    assert single["rate_unit"] == "req/s" and "sessions" not in single
    assert steady["rate_unit"] == "sessions/s" and steady["sessions"]["num_sessions"] == 200
    assert steady["num_requests"] == single["num_requests"]
    load = steady["sessions"]["at_answer"]
    assert load["steady"] is True, load  # the bound is a steady state's
    assert load["arrivals_s"] >= STEADY_SESSIONS * load["mean_session_s"]
    # both answers inside their grids, not "or more"
    assert steady["bracket_qps"][1] is not None and single["bracket_qps"][1] is not None
    assert steady["answer_qps"] < single["answer_qps"]
    # what the answer means in requests stays within the single-turn capacity too
    assert load["request_rate_per_s"] < single["answer_qps"] * 1.5
    curve = read_csv(_run(root) / "single" / contract.CAPACITY_CSV, contract.CAPACITY_TABLE)
    assert "concurrent_users" not in curve.columns
    assert "| req/s | phase |" in (_run(root) / "single" / contract.REPORT_MD).read_text()


@pytest.mark.parametrize(
    "real", [("capacity.verify=answer",), ("capacity.verify=search",), ("capacity.phase=real",)]
)
def test_the_real_phase_refuses_sessions_its_backend_cannot_run(
    tmp_path: Path, real: tuple[str, ...]
) -> None:
    """transformers' engine has no closed loop: replaying sessions on it is refused in one line
    naming the workload and capacity.verify, before any run directory or workload exists."""
    proc = run_cli(
        "capacity", "workload=multi_turn", "backend=hf_cb", *real, "output.run_id=x",
        cwd=tmp_path, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in proc.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stdout
    assert "capacity.verify=" in errors[0] and "workload.session.enabled=true" in errors[0]
    assert "backend.name=hf_cb" in errors[0] and "capacity.verify=false" in errors[0]
    assert not (tmp_path / "tmp").exists()
