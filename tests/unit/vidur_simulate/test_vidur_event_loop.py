"""Our event loop (``vidur.event_loop=fast``) makes Vidur's decisions batch for batch: the stage's
``request_metrics.csv`` and ``engine_step_log.csv`` are the same bytes as from Vidur's own loop
with its own metrics store, on every scheduler, from a light load to a burst, with prefill
chunks of one token, arrivals at the same instant, the engine overhead and its jitter, and a KV
cache small enough to hold admissions back. Where it cannot follow (KV-cache preemption, more
than one replica) Vidur's loop runs and the run says so."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.config.schema import ConfigError, OutputConfig
from gpu_simulate_test.config.vidur import (
    VidurConfig,
    VidurPredictorConfig,
    VidurSchedulerConfig,
    VidurSimulateStageConfig,
)
from gpu_simulate_test.core.profiling.bundle import ENGINE_STEPS_TABLE
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import read_json, write_csv, write_json
from gpu_simulate_test.vidur_simulate.stage import run as simulate_run
from tests.unit.calibration.test_engine_overhead import steps
from tests.vidur_bundle_factory import CPU, QWEN3_TINY, write_synthetic_bundle, write_workload_run

FAST_CASES = ("sarathi-light", "vllm-overhead", "orca-cap8")
"""One case a scheduler stays in ``make test``: the rewritten loop is held to Vidur's on every
run of the fast tier; the rest, and the heavier checks below, run in the slow tier."""

SARATHI, VLLM, ORCA = "sarathi", "vllm", "orca"


def knobs(name: str, cap: int, **more: int) -> VidurSchedulerConfig:
    # only int knobs here (block_size, chunk_size, ...)
    return VidurSchedulerConfig(name=name, batch_size_cap=cap, **more)  # type: ignore[arg-type]


CASES = {
    # name: (scheduler knobs, requests, rate (req/s), prompt range, output range, overhead)
    "sarathi-busy": (knobs(SARATHI, 8, chunk_size=128), 150, 200.0, (16, 400), (1, 40), False),
    "sarathi-light": (knobs(SARATHI, 32, chunk_size=256), 80, 5.0, (8, 64), (2, 16), False),
    # chunks of 1 token (counted as decodes by Vidur), prefills skipped for want of budget
    "sarathi-tiny-chunk": (knobs(SARATHI, 16, chunk_size=33), 60, 1e3, (1, 90), (1, 40), False),
    # a burst far above capacity: a long queue, full batches throughout
    "sarathi-burst": (knobs(SARATHI, 16, chunk_size=128), 100, 1e6, (64, 200), (8, 64), False),
    "sarathi-overhead": (knobs(SARATHI, 8, chunk_size=128), 120, 100.0, (16, 300), (1, 30), True),
    "vllm": (knobs(VLLM, 16, max_tokens_in_batch=512), 120, 100.0, (16, 300), (1, 32), False),
    "vllm-overhead": (knobs(VLLM, 8, max_tokens_in_batch=512), 80, 50.0, (16, 300), (1, 32), True),
    # one-token prompts: a prefill Vidur's predictor times as a decode, in a batch of its own
    "vllm-short-prompts": (knobs(VLLM, 4, max_tokens_in_batch=256), 60, 400.0, (1, 12), (1, 200),
                           False),
    "orca-cap1": (knobs(ORCA, 1), 40, 20.0, (8, 128), (1, 24), False),
    "orca-cap8": (knobs(ORCA, 8), 60, 50.0, (8, 128), (1, 24), False),
}  # fmt: skip


@pytest.fixture(scope="module")
def bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    """Two bundles: ops only, and ops with an hf_cb engine calibration and its step spread."""
    root = tmp_path_factory.mktemp("event_loop")
    plain = root / "plain"
    write_synthetic_bundle(plain, QWEN3_TINY, points=12)
    calibrated = root / "calibrated"
    bundle = write_synthetic_bundle(calibrated, QWEN3_TINY, points=12)
    meta = read_json(bundle / layout.BUNDLE_META)
    spread = {"percentiles": [0, 50, 100], "ratios": [0.9, 1.0, 1.6]}
    write_json(
        bundle / layout.BUNDLE_META,
        {**meta, "engine_calibration": {"hf_cb": {"step_jitter": spread}}},
    )
    write_csv(bundle / layout.ENGINE_STEPS, steps(), ENGINE_STEPS_TABLE)
    return {False: plain, True: calibrated}


def simulate(
    root: Path, run_id: str, workload: Path, profiles: Path, scheduler: VidurSchedulerConfig,
    loop: str, overhead: bool, **vidur: Any,
) -> Path:  # fmt: skip
    """The stage on ``loop`` (``fast``, ``vidur``, or ``vidur-lean``: Vidur's loop with the
    lean store); ``vidur`` holds further ``VidurConfig`` fields."""
    cfg = VidurSimulateStageConfig(
        model=QWEN3_TINY,
        hardware=CPU,
        vidur=VidurConfig(
            scheduler=scheduler,
            predictor=VidurPredictorConfig(num_training_job_threads=1),
            engine_overhead="hf_cb" if overhead else "none",
            step_jitter=overhead,
            frontend_latency=False,
            # the reference: Vidur's loop with Vidur's own metrics store (its lean one for
            # "vidur-lean")
            lean_metrics=loop != "vidur",
            event_loop="fast" if loop == "fast" else "vidur",
            **vidur,
        ),
        workload_dir=str(workload),
        profiling_root=str(profiles),
        output=OutputConfig(root=str(root), run_id=run_id),
        progress=False,
    )
    return simulate_run(cfg, {})


def arrivals(rng: np.random.Generator, n: int, qps: float) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(rng.exponential(1.0 / qps, n - 1))])


def assert_same_outputs(reference: Path, fast: Path, label: str) -> None:
    assert read_json(fast / layout.RUN_META)["event_loop"] == "fast", label
    assert read_json(reference / layout.RUN_META)["event_loop"] == "vidur", label
    for name in (layout.REQUEST_METRICS, layout.ENGINE_STEP_LOG):
        assert (fast / name).read_bytes() == (reference / name).read_bytes(), (label, name)


def on_both_loops(
    root: Path, label: str, workload: Path, profiles: Path, scheduler: VidurSchedulerConfig,
    overhead: bool = False, reference: str = "vidur",
) -> Path:  # fmt: skip
    """Simulate on ``reference`` (Vidur's loop) and on ours, check they wrote the same bytes;
    returns our run."""
    ref = simulate(root, f"{label}-{reference}", workload, profiles, scheduler, reference, overhead)
    fast = simulate(root, f"{label}-fast", workload, profiles, scheduler, "fast", overhead)
    assert_same_outputs(ref, fast, label)
    return fast


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=() if c in FAST_CASES else pytest.mark.slow) for c in sorted(CASES)],
)
def test_event_loop_matches_vidurs_loop(
    bundles: dict[bool, Path], tmp_path: Path, case: str
) -> None:
    scheduler, n, qps, prompt, output, overhead = CASES[case]
    rng = np.random.default_rng(7)
    workload = write_workload_run(
        tmp_path,
        "w",
        rng.integers(prompt[0], prompt[1] + 1, n),
        rng.integers(output[0], output[1] + 1, n),
        arrivals(rng, n, qps),
    )
    fast = on_both_loops(tmp_path, case, workload, bundles[overhead], scheduler, overhead)
    assert (fast / layout.REQUEST_METRICS).read_text().count("\n") == n + 1
    steps_log = (fast / layout.ENGINE_STEP_LOG).read_text().count("\n") - 1
    assert steps_log >= max(output[1] // 2, 2)  # a real simulation, batch by batch


@pytest.mark.slow
def test_arrivals_at_the_same_instant_queue_before_the_next_batch(
    bundles: dict[bool, Path], tmp_path: Path
) -> None:
    """Requests arriving in threes at one instant (Vidur orders events by time, then by
    creation: all three join the queue before the next batch is formed)."""
    rng = np.random.default_rng(3)
    n = 90
    instants = np.repeat(np.round(arrivals(rng, n // 3, 40.0), 2), 3)
    workload = write_workload_run(
        tmp_path, "w", rng.integers(8, 200, n), rng.integers(1, 20, n), instants
    )
    for scheduler in (knobs(SARATHI, 8, chunk_size=64), knobs(VLLM, 8), knobs(ORCA, 4)):
        on_both_loops(tmp_path, scheduler.name, workload, bundles[False], scheduler)


@pytest.mark.slow
def test_a_small_kv_cache_holds_admissions_back_the_same_way(
    bundles: dict[bool, Path], tmp_path: Path
) -> None:
    """100 blocks of 16 tokens hold ~20 of these requests (cap 32): new requests wait for
    blocks (the watermark keeps one free). Prompts end 8 tokens short of a block and outputs are
    at most 8 tokens, so no decode needs a new block and nothing is preempted."""
    rng = np.random.default_rng(7)
    n = 80
    workload = write_workload_run(
        tmp_path, "w", 16 * rng.integers(2, 9, n) - 8, rng.integers(1, 9, n), arrivals(rng, n, 1e5)
    )
    for scheduler in (
        knobs(SARATHI, 32, chunk_size=512, num_blocks=100),
        knobs(VLLM, 32, max_tokens_in_batch=512, num_blocks=100),
    ):
        fast = on_both_loops(tmp_path, scheduler.name, workload, bundles[False], scheduler)
        roomy = replace(scheduler, num_blocks=0)
        big = simulate(
            tmp_path, f"{scheduler.name}-big", workload, bundles[False], roomy, "fast", False
        )
        held = pd.read_csv(fast / layout.REQUEST_METRICS)["ttft_s"]
        free = pd.read_csv(big / layout.REQUEST_METRICS)["ttft_s"]
        assert held.quantile(0.9) > 1.03 * free.quantile(0.9)  # the cache did bind


@pytest.mark.slow
def test_a_kv_cache_too_small_to_decode_in_is_one_clear_error(
    bundles: dict[bool, Path], tmp_path: Path
) -> None:
    """Long outputs in 40 blocks: running requests run out of blocks. Our loop sees it coming,
    hands over to Vidur's, which fails its own assertion; the stage says why in one line."""
    rng = np.random.default_rng(7)
    n = 40
    workload = write_workload_run(
        tmp_path, "w", rng.integers(16, 65, n), rng.integers(50, 200, n), arrivals(rng, n, 500.0)
    )
    scheduler = knobs(SARATHI, 32, chunk_size=256, num_blocks=40)
    with pytest.raises(ConfigError, match=r"vidur.scheduler.num_blocks: the KV cache runs out"):
        simulate(tmp_path, "tight", workload, bundles[False], scheduler, "fast", False)
    with pytest.raises(AssertionError):  # Vidur's own loop: the same failure, unexplained
        simulate(tmp_path, "tight-vidur", workload, bundles[False], scheduler, "vidur", False)


@pytest.mark.slow
def test_what_our_loop_does_not_simulate_runs_on_vidurs(
    bundles: dict[bool, Path], tmp_path: Path
) -> None:
    """A chrome trace needs Vidur's events: Vidur's loop runs, the run says so, same numbers."""
    rng = np.random.default_rng(5)
    n = 30
    workload = write_workload_run(
        tmp_path, "w", rng.integers(8, 100, n), rng.integers(1, 12, n), arrivals(rng, n, 50.0)
    )
    scheduler = knobs(SARATHI, 8, chunk_size=128)
    fast = simulate(tmp_path, "fast", workload, bundles[False], scheduler, "fast", False)
    traced = simulate(
        tmp_path, "traced", workload, bundles[False], scheduler, "fast", False, chrome_trace=True
    )
    meta = read_json(traced / layout.RUN_META)
    assert meta["event_loop"] == "vidur"
    assert "chrome trace" in meta["event_loop_note"]
    assert (traced / "vidur" / "chrome_trace.json").is_file()
    for name in (layout.REQUEST_METRICS, layout.ENGINE_STEP_LOG):
        assert (traced / name).read_bytes() == (fast / name).read_bytes(), name


@pytest.mark.slow
def test_dropping_old_decode_batches_and_the_step_log_change_no_number(
    bundles: dict[bool, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Long runs keep only the decode batches a running request was in (forced here every 8
    batches), and ``vidur.step_log=false`` writes no per-batch log: the requests' numbers are
    the same bytes either way."""
    from gpu_simulate_test.vidur_simulate import event_loop

    rng = np.random.default_rng(11)
    n = 120
    workload = write_workload_run(
        tmp_path, "w", rng.integers(16, 300, n), rng.integers(1, 60, n), arrivals(rng, n, 150.0)
    )
    scheduler = knobs(SARATHI, 8, chunk_size=128)
    whole = simulate(tmp_path, "whole", workload, bundles[False], scheduler, "fast", False)
    monkeypatch.setattr(event_loop, "COMPACT_AT", 8)
    trimmed = simulate(
        tmp_path, "trimmed", workload, bundles[False], scheduler, "fast", False, step_log=False
    )
    assert not (trimmed / layout.ENGINE_STEP_LOG).exists()
    assert (whole / layout.ENGINE_STEP_LOG).is_file()
    got = (trimmed / layout.REQUEST_METRICS).read_bytes()
    assert got == (whole / layout.REQUEST_METRICS).read_bytes()


@pytest.mark.parametrize(
    "seed", [pytest.param(s, marks=() if s == 0 else pytest.mark.slow) for s in range(8)]
)
def test_random_configs_give_the_same_batches(
    bundles: dict[bool, Path], tmp_path: Path, seed: int
) -> None:
    """Random scheduler, cap, budget, lengths and load (sometimes arrivals in groups): our loop
    and Vidur's (with the lean store, byte-identical to its own: test_vidur_lean_metrics.py) give
    the same request rows and the same batches."""
    rng = np.random.default_rng(100 + seed)
    name = [SARATHI, VLLM, ORCA][seed % 3]
    cap = int(rng.choice([1, 2, 4, 8, 16, 32]))
    scheduler = knobs(
        name,
        cap,
        chunk_size=int(rng.choice([16, 32, 64, 100, 256])),
        max_tokens_in_batch=int(rng.choice([256, 512, 2048])),
    )
    n = int(rng.integers(30, 90))
    qps = float(10 ** rng.uniform(0.5, 4.5))
    times = arrivals(rng, n, qps)
    if seed % 4 == 3:  # arrivals in groups at one instant
        times = np.round(times, 1)
    top = int(rng.integers(20, 250))
    workload = write_workload_run(
        tmp_path, "w", rng.integers(1, 250, n), rng.integers(1, top, n), times
    )
    overhead = seed % 4 == 1
    label = f"seed{seed}"
    on_both_loops(tmp_path, label, workload, bundles[overhead], scheduler, overhead, "vidur-lean")


@pytest.mark.slow
@pytest.mark.parametrize("overhead", [False, True])
def test_step_time_scale_multiplies_every_step(
    bundles: dict[bool, Path], tmp_path: Path, overhead: bool
) -> None:
    """``vidur.step_time_scale=1.5``: a burst (every request at t=0, so the batches do not
    depend on time) gives the same batches, each 1.5 times as long, on Vidur's loop and ours
    (the same bytes) and on vLLM's V1 scheduler; the overhead's jitter draws stay the same."""
    rng = np.random.default_rng(11)
    n = 40
    workload = write_workload_run(
        tmp_path, "w", rng.integers(8, 120, n), rng.integers(2, 16, n), np.zeros(n)
    )
    cases = (
        (knobs(SARATHI, 8, chunk_size=128), ("fast", "vidur")),
        (knobs("vllm_v1", 8, max_tokens_in_batch=256), ("fast",)),
    )
    for scheduler, loops in cases:
        scaled_runs = {}
        for loop in loops:
            runs = {
                scale: simulate(
                    tmp_path,
                    f"{scheduler.name}-{loop}-{overhead}-{scale}",
                    workload,
                    bundles[overhead],
                    scheduler,
                    loop,
                    overhead,
                    step_time_scale=scale,
                )
                for scale in (1.0, 1.5)
            }
            plain, scaled = (pd.read_csv(runs[s] / layout.ENGINE_STEP_LOG) for s in (1.0, 1.5))
            shape = ["num_prefill_tokens", "num_decode_tokens"]
            pd.testing.assert_frame_equal(plain[shape], scaled[shape])
            ratio = scaled["elapsed_ms"].to_numpy() / plain["elapsed_ms"].to_numpy()
            np.testing.assert_allclose(ratio, 1.5, rtol=1e-6, err_msg=f"{scheduler.name} {loop}")
            assert len(plain) >= 8  # a real simulation, batch by batch
            scaled_runs[loop] = runs[1.5]
        if len(scaled_runs) == 2:
            fast, vidur = scaled_runs["fast"], scaled_runs["vidur"]
            for name in (layout.REQUEST_METRICS, layout.ENGINE_STEP_LOG):
                assert (fast / name).read_bytes() == (vidur / name).read_bytes(), name


def test_step_time_scale_must_be_a_positive_factor() -> None:
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ConfigError, match=r"vidur\.step_time_scale=.* positive factor"):
            VidurConfig(step_time_scale=bad)


def test_an_unknown_event_loop_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"vidur\.event_loop"):
        VidurConfig(event_loop="faster")


def test_vidurs_own_metrics_store_needs_vidurs_loop() -> None:
    """``lean_metrics=false`` keeps a store only Vidur's loop fills: asked for with our loop it is
    refused, not silently run on Vidur's loop."""
    with pytest.raises(ConfigError, match=r"vidur\.lean_metrics=false .* vidur\.event_loop=vidur"):
        VidurConfig(lean_metrics=False, event_loop="fast")
    assert VidurConfig(lean_metrics=False, event_loop="vidur").lean_metrics is False


def test_the_library_runs_the_configs_event_loop_by_default() -> None:
    from dataclasses import fields

    from gpu_simulate_test.vidur_simulate.simulator import SimulationRequest

    defaults = {f.name: f.default for f in fields(SimulationRequest)}
    assert defaults["event_loop"] == VidurConfig().event_loop == "fast"
    assert defaults["lean_metrics"] is VidurConfig().lean_metrics
    assert defaults["step_log"] is VidurConfig().step_log
    assert defaults["step_time_scale"] == VidurConfig().step_time_scale


@pytest.mark.slow
def test_ops_scaled_down_for_an_engine_faster_than_its_profiled_ops(
    bundles: dict[bool, Path], tmp_path: Path
) -> None:
    """An engine calibration whose steps are faster than the ops Vidur sums (CUDA graphs):
    the ops are scaled down (``ops_scale`` below 1 in run_meta), Vidur's loop and ours still
    write the same bytes, and the decode steps come out near the calibrated ones, not as the
    unscaled ops."""
    graphs = tmp_path / "graphs"
    shutil.copytree(bundles[True], graphs)
    engine_steps = steps()
    # every step 20-50 us: under the synthetic ops' launch-bound 4 us per op, summed
    engine_steps["step_ms"] = 0.02 + engine_steps["step_ms"] * 1e-3
    (table,) = graphs.rglob(layout.ENGINE_STEPS)
    write_csv(table, engine_steps, ENGINE_STEPS_TABLE)
    rng = np.random.default_rng(5)
    n = 40
    workload = write_workload_run(
        tmp_path, "w", rng.integers(8, 120, n), rng.integers(2, 16, n),
        np.cumsum(rng.exponential(0.01, n)),
    )  # fmt: skip
    scheduler = knobs(SARATHI, 8, chunk_size=128)
    runs = {
        loop: simulate(tmp_path, f"graphs-{loop}", workload, graphs, scheduler, loop, True)
        for loop in ("fast", "vidur")
    }
    for name in (layout.REQUEST_METRICS, layout.ENGINE_STEP_LOG):
        assert (runs["fast"] / name).read_bytes() == (runs["vidur"] / name).read_bytes(), name
    fitted = read_json(runs["fast"] / "run_meta.json")["engine_overhead"]
    assert 0 < fitted["ops_scale"] < 1 and 0 < fitted["prompt_ops_scale"] < 1
    log = pd.read_csv(runs["fast"] / layout.ENGINE_STEP_LOG)
    decodes = log[log["num_prefill_tokens"] == 0]
    calibrated = engine_steps.loc[engine_steps["phase"] == "decode", "step_ms"]
    # the jitter stretches a step by at most 1.6
    assert decodes["elapsed_ms"].max() <= 1.6 * calibrated.max() * (1 + 1e-9)
