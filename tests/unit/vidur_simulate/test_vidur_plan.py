"""Checks the simulate stage runs before any long work: coverage, context, KV cache, bad inputs."""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.calibration.overhead import FrontEnd
from gpu_simulate_test.config.schema import ConfigError, HardwareConfig
from gpu_simulate_test.config.vidur import (
    ProfileRangesConfig,
    VidurConfig,
    VidurPredictorConfig,
    VidurSchedulerConfig,
    VidurSimulateStageConfig,
)
from gpu_simulate_test.core.profiling.bundle import load_bundle
from gpu_simulate_test.core.profiling.grid import resolve_ranges
from gpu_simulate_test.io.artifacts import ArtifactError
from gpu_simulate_test.vidur_simulate import plan
from gpu_simulate_test.vidur_simulate.stage import prepare, write_trace
from tests.vidur_bundle_factory import (
    QWEN3_0_6B,
    QWEN3_TINY,
    SyntheticRanges,
    write_synthetic_bundle,
    write_workload_run,
)

CPU = HardwareConfig(
    name="cpu", device="cpu", peak_bf16_tflops=1.0, memory_bandwidth_gb_s=20.0, memory_gib=24.0
)
H200 = HardwareConfig(
    name="h200", device="cuda", peak_bf16_tflops=989.0, memory_bandwidth_gb_s=4800, memory_gib=141
)
PREFILL = [100, 700, 33, 1000]
DECODE = [20, 300, 1, 50]
ARRIVALS = [0.0, 0.1234567891234, 0.5, 0.5]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    write_workload_run(tmp_path, "w", PREFILL, DECODE, ARRIVALS)
    return tmp_path


def stage(root: Path, **scheduler: object) -> VidurSimulateStageConfig:
    return VidurSimulateStageConfig(
        model=QWEN3_TINY,
        hardware=CPU,
        workload_dir=str(root / "workload" / "w"),
        profiling_root=str(root / "profiles"),
        vidur=VidurConfig(scheduler=VidurSchedulerConfig(**scheduler)),  # type: ignore[arg-type]
    )


def test_requirements_follow_each_scheduler() -> None:
    prefill, decode = np.array(PREFILL), np.array(DECODE)
    sarathi = plan.requirements(prefill, decode, VidurSchedulerConfig("sarathi", chunk_size=256))
    assert sarathi.max_request_tokens == 1050 and sarathi.max_prompt_tokens == 1000
    assert sarathi.max_prefill_chunk == 256 and sarathi.max_batch_tokens == 256
    assert sarathi.max_batch_size == 4  # cap 32, but only 4 requests
    vllm = plan.requirements(prefill, decode, VidurSchedulerConfig("vllm", max_tokens_in_batch=900))
    assert vllm.max_prefill_chunk == 1050 and vllm.max_batch_tokens == 900
    orca = plan.requirements(prefill, decode, VidurSchedulerConfig("orca", batch_size_cap=2))
    assert orca.max_batch_size == 2 and orca.max_batch_tokens == 1050 + 1000


def test_sarathi_batches_can_hold_several_short_prompts() -> None:
    """Three 40-token prompts arriving during a slow step share the next batch: 3 x 50 tokens
    (prompts and outputs) fit a 256 budget, so lookups up to 150 tokens must exist."""
    three = plan.requirements(
        np.array([40, 40, 40]),
        np.array([10, 10, 10]),
        VidurSchedulerConfig("sarathi", chunk_size=256, batch_size_cap=8),
    )
    assert three.max_prefill_chunk == 50 and three.max_batch_tokens == 150


def test_prediction_bounds_cover_every_lookup_key() -> None:
    needs = plan.Requirements(1050, 1000, 300, 5, 1050)
    bounds = plan.prediction_bounds(needs, VidurPredictorConfig())
    assert bounds["prediction_max_tokens_per_request"] >= 1050 + 63  # kv rounded up to 64
    assert bounds["prediction_max_tokens_per_request"] % 64 == 0
    assert bounds["prediction_max_prefill_chunk_size"] >= 1056  # chunk rounded up to 32
    assert bounds["prediction_max_batch_size"] >= 5


def test_prepare_accepts_a_covering_bundle(root: Path) -> None:
    write_synthetic_bundle(root / "profiles", QWEN3_TINY)
    inputs = prepare(stage(root))
    assert inputs.max_tokens == 1056 and inputs.max_tokens % 16 == 0
    assert inputs.kv_cache.derived and inputs.kv_cache.dtype == "float32"
    assert inputs.workload.workload_id.startswith("wl-")


def test_missing_bundle_names_the_directory(root: Path) -> None:
    with pytest.raises(ArtifactError, match=r"profiles/cpu/qwen3_tiny: no profiling bundle"):
        prepare(stage(root))


def test_bundle_missing_a_file_names_it(root: Path) -> None:
    bundle = write_synthetic_bundle(root / "profiles", QWEN3_TINY)
    (bundle / "attention.csv").unlink()
    with pytest.raises(ArtifactError, match=r"attention.csv: file does not exist"):
        prepare(stage(root))


def test_bundle_of_another_model_is_refused(root: Path) -> None:
    other = replace(QWEN3_TINY, intermediate_size=512)
    bundle = write_synthetic_bundle(root / "other", other)
    target = root / "profiles" / "cpu"
    target.mkdir(parents=True)
    bundle.rename(target / "qwen3_tiny")
    with pytest.raises(ArtifactError, match=r"intermediate_size: bundle 512, model 384"):
        prepare(stage(root))


@pytest.mark.parametrize(
    ("ranges", "knobs", "message"),
    [
        (SyntheticRanges(max_num_tokens=128), {}, r"tokens per batch: needs 512, bundle has 128"),
        (SyntheticRanges(max_batch_size=2), {}, r"decode batch size: needs 4, bundle has 2"),
        (SyntheticRanges(max_prefill_chunk=64), {}, r"prefill chunk: needs 512, bundle has 64"),
        (
            SyntheticRanges(max_kv_cache_size=1024),
            {},
            r"KV-cache size \(longest request\): needs 1050, bundle has 1024",
        ),
        (SyntheticRanges(block_size=32), {}, r"profiled with block_size=32"),
    ],
)
def test_coverage_gaps_are_named(
    root: Path, ranges: SyntheticRanges, knobs: dict[str, object], message: str
) -> None:
    write_synthetic_bundle(root / "profiles", QWEN3_TINY, ranges=ranges, points=6)
    with pytest.raises(ArtifactError, match=message) as err:
        prepare(stage(root, **knobs))
    if "bundle has" in message:  # a range gap names the command that fixes it
        assert f"vidur_profile model={QWEN3_TINY.name} hardware=cpu" in str(err.value)
        assert "output.overwrite=true" in str(err.value)


def test_vllm_budget_below_the_longest_prompt_is_refused(root: Path) -> None:
    write_synthetic_bundle(root / "profiles", QWEN3_TINY, points=6)
    with pytest.raises(ConfigError, match=r"max_tokens_in_batch=512 is below the longest prompt"):
        prepare(stage(root, name="vllm", max_tokens_in_batch=512))


def test_too_few_kv_blocks_for_the_longest_request(root: Path) -> None:
    write_synthetic_bundle(root / "profiles", QWEN3_TINY, points=6)
    with pytest.raises(ConfigError, match=r"cannot hold the longest request \(1050 tokens\)"):
        prepare(stage(root, num_blocks=65))
    assert prepare(stage(root, num_blocks=66)).kv_cache.num_blocks == 66


def test_request_longer_than_the_context_is_refused(tmp_path: Path) -> None:
    write_workload_run(tmp_path, "w", [4000], [200], [0.0])
    with pytest.raises(ArtifactError, match=r"request 0 has 4000 prompt \+ 200 output tokens"):
        prepare(stage(tmp_path))


def test_missing_workload_dir_is_an_artifact_error(tmp_path: Path) -> None:
    with pytest.raises(ArtifactError, match=r"run directory does not exist"):
        prepare(stage(tmp_path))


def test_unknown_scheduler_is_rejected_by_the_config() -> None:
    with pytest.raises(ConfigError, match=r"vidur.scheduler.name='fcfs'"):
        VidurSchedulerConfig(name="fcfs")


def test_num_blocks_use_the_true_head_dim() -> None:
    knobs = VidurSchedulerConfig(memory_margin_fraction=0.1)
    kv = plan.kv_cache_plan(QWEN3_0_6B, H200, knobs, "bfloat16")
    per_token = 2 * 28 * 8 * 128 * 2  # K and V, 28 layers, 8 KV heads, head_dim 128, bf16
    assert kv.kv_bytes_per_token == per_token == QWEN3_0_6B.kv_cache_bytes_per_token
    assert 590e6 < plan.num_parameters(QWEN3_0_6B) < 600e6  # Qwen3-0.6B: 596M with tied head
    expected = (int(141 * 2**30 * 0.9) - kv.weight_bytes) // (per_token * 16)
    assert kv.num_blocks == expected
    # Vidur's hidden/heads = 64 would have doubled the blocks
    assert kv.num_blocks < (int(141 * 2**30 * 0.9) - kv.weight_bytes) // (per_token // 2 * 16)
    fp32 = plan.kv_cache_plan(QWEN3_0_6B, H200, knobs, "float32")
    assert fp32.kv_bytes_per_token == 2 * per_token and fp32.num_blocks < kv.num_blocks
    fixed = plan.kv_cache_plan(QWEN3_0_6B, H200, replace(knobs, num_blocks=1000), "bfloat16")
    assert fixed.num_blocks == 1000 and not fixed.derived


def test_model_too_big_for_the_device() -> None:
    small = replace(CPU, memory_gib=0.5)
    with pytest.raises(ConfigError, match=r"does not fit in hardware cpu"):
        plan.kv_cache_plan(QWEN3_0_6B, small, VidurSchedulerConfig(), "float32")


def test_trace_file_round_trips_exactly(root: Path) -> None:
    write_synthetic_bundle(root / "profiles", QWEN3_TINY, points=6)
    inputs = prepare(stage(root))
    path = write_trace(root / "trace.csv", inputs, inputs.scheduler_arrival_s())
    back = pd.read_csv(path)
    assert list(back.columns) == list(plan.TRACE_COLUMNS)
    assert (back["Date"] == plan.TRACE_DATE).all()
    assert back["PromptTokenCount"].tolist() == PREFILL
    assert back["CompletionTokenCount"].tolist() == DECODE
    assert back["Time"].tolist() == ARRIVALS  # bit-exact floats
    assert math.isclose(back["Time"].iloc[1], 0.1234567891234, rel_tol=0, abs_tol=0)


def test_the_front_end_delays_arrivals_at_the_scheduler_in_order(root: Path) -> None:
    write_synthetic_bundle(root / "profiles", QWEN3_TINY, points=6)
    inputs = prepare(stage(root))
    assert inputs.frontend is None  # a bundle without a calibration: no front end
    assert inputs.scheduler_arrival_s().tolist() == ARRIVALS
    front = replace(
        inputs, frontend=FrontEnd(input_ms=2.0, output_ms=1.0, input_per_running_ms=100.0)
    )
    running = np.zeros(len(ARRIVALS))
    running[0] = 3  # the first request waits 302 ms: the ones sent after it cannot overtake it
    reached = front.scheduler_arrival_s(running)
    assert reached[0] == pytest.approx(ARRIVALS[0] + 0.302)
    assert np.all(np.diff(reached) >= 0)
    assert reached[-1] == pytest.approx(max(ARRIVALS[-1] + 0.002, reached[0]))


def test_by_queue_a_request_reaches_the_scheduler_after_the_quiet_input_and_its_wait(
    root: Path,
) -> None:
    write_synthetic_bundle(root / "profiles", QWEN3_TINY, points=6)
    inputs = prepare(stage(root))
    front = replace(
        inputs,
        frontend=FrontEnd(input_ms=8.0, output_ms=1.0, input_per_running_ms=100.0,
                          quiet_input_ms=3.0),
        input_by_queue=True,
    )  # fmt: skip
    first = front.scheduler_arrival_s()  # the first pass: no waits yet, not the line's 8 ms
    assert first == pytest.approx(np.maximum.accumulate(np.array(ARRIVALS) + 0.003))
    waits = np.zeros(len(ARRIVALS))
    waits[1] = 0.010
    reached = front.scheduler_arrival_s(np.full(len(ARRIVALS), 5.0), waits)  # running unread
    assert reached[1] == pytest.approx(ARRIVALS[1] + 0.013)
    assert np.all(np.diff(reached) >= 0)  # handed on in order
    line = replace(front, input_by_queue=False).scheduler_arrival_s(np.zeros(len(ARRIVALS)))
    assert line[0] == pytest.approx(ARRIVALS[0] + 0.008)


def test_a_request_drawn_slow_on_its_way_in_reaches_the_engine_that_much_later(root: Path) -> None:
    """The spread is added after the requests are put in order (the measured hops already carry
    the holdups behind slower ones), and never brings a request in before its send."""
    from gpu_simulate_test.calibration.input_spread import SPREAD_LEVELS
    from gpu_simulate_test.vidur_simulate.inputs import first_requests

    write_synthetic_bundle(root / "profiles", QWEN3_TINY, points=6)
    inputs = prepare(stage(root))
    spread = tuple(-5.0 if level < 0.99 else 500.0 for level in SPREAD_LEVELS)
    front = replace(
        inputs,
        frontend=FrontEnd(input_ms=2.0, output_ms=1.0, input_residual_ms=((0, spread),)),
        input_spread_levels=np.r_[0.999, np.full(len(ARRIVALS) - 1, 0.5)],
    )
    reached = front.scheduler_arrival_s(np.zeros(len(ARRIVALS)))
    assert reached[0] == pytest.approx(ARRIVALS[0] + 0.502)  # its level: the slowest hop
    assert reached[1:] == pytest.approx(np.array(ARRIVALS[1:]))  # -5 ms: at its send, no earlier
    on_line = replace(front, input_spread_levels=None).scheduler_arrival_s()
    assert on_line[0] == pytest.approx(ARRIVALS[0] + 0.002)
    assert np.all(np.diff(on_line) >= 0)  # on the line, handed on in order
    first = first_requests(front, 2).input_spread_levels
    assert first is not None and first.tolist() == [0.999, 0.5]


def test_the_idle_spread_draws_only_for_requests_sent_to_an_idle_engine(root: Path) -> None:
    """``vidur.frontend_idle_spread``: a request sent with nothing in flight reads its level off
    the idle sends' spread; one sent to a busy engine stays on the line (its hop was only read
    within the step in progress)."""
    from gpu_simulate_test.calibration.input_spread import SPREAD_LEVELS

    write_synthetic_bundle(root / "profiles", QWEN3_TINY, points=6)
    inputs = prepare(stage(root))
    spread = tuple(4.0 for _ in SPREAD_LEVELS)
    front = replace(
        inputs,
        frontend=FrontEnd(input_ms=2.0, output_ms=1.0,
                          input_residual_ms=((0, spread), (1, spread))),
        input_spread_levels=np.full(len(ARRIVALS), 0.5),
        input_spread_idle_only=True,
    )  # fmt: skip
    running = np.zeros(len(ARRIVALS))
    running[1] = 2
    reached = front.scheduler_arrival_s(running)
    assert reached[0] == pytest.approx(ARRIVALS[0] + 0.006)  # idle: the line's 2 + its 4 ms
    assert reached[1] == pytest.approx(max(ARRIVALS[1] + 0.002, reached[0]))  # busy: the line
    every = replace(front, input_spread_idle_only=False).scheduler_arrival_s(running)
    assert every[1] == pytest.approx(max(ARRIVALS[1], ARRIVALS[0]) + 0.006)  # busy spread too


def test_an_idle_engines_first_token_draws_its_way_back_from_the_measured_spread(
    root: Path,
) -> None:
    """``vidur.frontend_idle_spread`` with a calibration of version 16 on: a request sent to an
    idle engine reads its own level off the first tokens' spread around the queue's way back;
    one sent to a busy engine keeps the queue's."""
    from gpu_simulate_test.calibration.frontend_queue import FrontEndQueue
    from gpu_simulate_test.calibration.input_spread import SPREAD_LEVELS, spread_levels
    from gpu_simulate_test.vidur_simulate.inputs import first_requests, first_spread

    write_synthetic_bundle(root / "profiles", QWEN3_TINY, points=6)
    inputs = prepare(stage(root))
    spread = tuple(10.0 * level for level in SPREAD_LEVELS)  # 0.1 .. 9.9 ms, linear
    queue = FrontEndQueue(1.0, 0.5, 0.2, 0.4, first_idle_residual_ms=spread)
    assert first_spread(queue, False, 4, 7) is None  # off
    assert first_spread(replace(queue, first_idle_residual_ms=()), True, 4, 7) is None  # v15
    levels = first_spread(queue, True, len(ARRIVALS), 7)
    assert levels is not None and not np.array_equal(levels, spread_levels(len(ARRIVALS), 7))
    drawn = replace(inputs, frontend_queue=queue, first_spread_levels=levels)
    running = np.zeros(len(ARRIVALS))
    running[0] = 1
    extra = drawn.first_token_spread_s(running)
    assert isinstance(extra, np.ndarray) and extra[0] == 0.0  # busy at its send: the queue's
    assert extra[1:] == pytest.approx(np.interp(levels[1:], SPREAD_LEVELS, spread) / 1e3)
    assert inputs.first_token_spread_s(running) == 0.0  # no levels: no spread
    kept = first_requests(drawn, 2).first_spread_levels
    assert kept is not None and kept.tolist() == levels[:2].tolist()


def test_a_busy_engines_first_token_draws_from_its_bucket_of_requests_in_flight(
    root: Path,
) -> None:
    """``vidur.frontend_busy_spread`` with a calibration of version 18 on: a request sent with
    requests in flight reads its level off the spread of its bucket (the nearest measured
    below); with the idle spread off, one sent to an idle engine keeps the queue's."""
    from gpu_simulate_test.calibration.frontend_queue import FrontEndQueue
    from gpu_simulate_test.calibration.input_spread import SPREAD_LEVELS
    from gpu_simulate_test.vidur_simulate.inputs import first_spread

    write_synthetic_bundle(root / "profiles", QWEN3_TINY, points=6)
    inputs = prepare(stage(root))
    low = tuple(1.0 * level for level in SPREAD_LEVELS)  # 0.01 .. 0.99 ms
    high = tuple(20.0 * level for level in SPREAD_LEVELS)  # 0.2 .. 19.8 ms
    queue = FrontEndQueue(1.0, 0.5, 0.2, 0.4, first_busy_residual_ms=((1, low), (8, high)))
    assert first_spread(queue, True, 4, 7) is None  # the idle spread alone: none recorded
    levels = first_spread(queue, False, len(ARRIVALS), 7, busy=True)
    assert levels is not None
    drawn = replace(
        inputs,
        frontend_queue=queue,
        first_spread_levels=levels,
        first_spread_idle=False,
        first_spread_busy=True,
    )
    running = np.array([0, 1, 5, 12] + [0] * (len(ARRIVALS) - 4))
    extra = drawn.first_token_spread_s(running)
    assert isinstance(extra, np.ndarray) and extra[0] == 0.0  # idle at its send: the queue's
    assert extra[1:3] == pytest.approx(np.interp(levels[1:3], SPREAD_LEVELS, low) / 1e3)
    assert extra[3] == pytest.approx(np.interp(levels[3], SPREAD_LEVELS, high) / 1e3)
    off = replace(drawn, first_spread_busy=False).first_token_spread_s(running)
    assert np.all(np.asarray(off) == 0.0)


def test_a_busy_engines_way_in_draws_from_the_spread_fitted_through_the_steps(
    root: Path,
) -> None:
    """``vidur.frontend_busy_hop`` with a calibration of version 19 on: a request sent with
    others in flight reaches the scheduler at the line plus its level read off the busy sends'
    spread, after the order and never before its send; one sent to an idle engine stays on its
    way in; off, beside the every-send spread, or a calibration without it: on the line, and
    ``run_meta.json`` says why."""
    from gpu_simulate_test.calibration.input_spread import (
        BUSY_HOP_STREAM,
        SPREAD_LEVELS,
        spread_levels,
    )
    from gpu_simulate_test.calibration.overhead import FrontEnd
    from gpu_simulate_test.vidur_simulate.inputs import busy_hop, first_requests

    write_synthetic_bundle(root / "profiles", QWEN3_TINY, points=6)
    inputs = prepare(stage(root))
    spread = tuple(-3.0 + 10.0 * level for level in SPREAD_LEVELS)  # -2.9 .. +6.9 ms
    front = FrontEnd(input_ms=2.0, output_ms=1.0, busy_hop_residual_ms=((1, spread),))
    n = len(ARRIVALS)
    assert busy_hop(front, False, False, False, n, 7) == (None, "off")
    assert busy_hop(front, True, True, False, n, 7)[0] is None  # the way in by the queue
    assert busy_hop(None, True, False, False, n, 7)[1].startswith("none: no front end")
    closed = busy_hop(front, True, False, False, n, 7, closed_loop=True)
    assert closed[0] is None and "closed loop" in closed[1]  # its sends are taken as idle
    assert "spreads every send" in busy_hop(front, True, False, True, n, 7)[1]
    assert "before version 19" in busy_hop(replace(front, busy_hop_residual_ms=()),
                                           True, False, False, n, 7)[1]  # fmt: skip
    levels, note = busy_hop(front, True, False, False, n, 7)
    assert note == "drawn (seed 7, the busy sends)" and levels is not None
    assert levels.tolist() == spread_levels(n, 7, BUSY_HOP_STREAM).tolist()
    drawn = replace(inputs, frontend=front, busy_hop_levels=levels)
    running = np.zeros(n)
    running[1:] = 3
    reached = drawn.scheduler_arrival_s(running)
    line = replace(inputs, frontend=front).scheduler_arrival_s(running)
    assert reached[0] == pytest.approx(line[0])  # idle at its send: its own way in
    hop_s = np.interp(levels[1:], SPREAD_LEVELS, spread) / 1e3
    assert reached[1:] == pytest.approx(np.maximum(line[1:] + hop_s, ARRIVALS[1:]))
    assert np.all(reached >= ARRIVALS) and np.any(hop_s != 0.0)
    kept = first_requests(drawn, 2).busy_hop_levels
    assert kept is not None and kept.tolist() == levels[:2].tolist()


def test_the_spread_tail_reaches_every_front_end_draw_when_set(root: Path) -> None:
    """``vidur.frontend_spread_tail``: ``prepare`` hands it on, and then the first token's way
    back and a busy send's way in both read a level above the 99th percentile beyond its
    quantile (off: at it)."""
    from gpu_simulate_test.calibration.frontend_queue import FrontEndQueue
    from gpu_simulate_test.calibration.input_spread import SPREAD_LEVELS
    from gpu_simulate_test.calibration.overhead import FrontEnd

    write_synthetic_bundle(root / "profiles", QWEN3_TINY, points=6)
    inputs = prepare(stage(root))
    assert inputs.spread_tail is False
    cfg = stage(root)
    tailed_cfg = replace(cfg, vidur=replace(cfg.vidur, frontend_spread_tail=True))
    assert prepare(tailed_cfg).spread_tail is True
    spread = tuple(10.0 * level for level in SPREAD_LEVELS)  # 0.1 .. 9.9 ms
    n = len(ARRIVALS)
    levels = np.full(n, 0.999)
    running = np.ones(n)
    queue = FrontEndQueue(1.0, 0.5, 0.2, 0.4, first_busy_residual_ms=((1, spread),))
    drawn = replace(inputs, frontend_queue=queue, first_spread_levels=levels,
                    first_spread_idle=False, first_spread_busy=True)  # fmt: skip
    rise = (spread[-1] - spread[-2]) / np.log(5.0)  # ms per e-fold beyond the 99th
    assert drawn.first_token_spread_s(running) == pytest.approx(np.full(n, spread[-1] / 1e3))
    tailed = replace(drawn, spread_tail=True).first_token_spread_s(running)
    assert tailed == pytest.approx(np.full(n, (spread[-1] + rise * np.log(10.0)) / 1e3))
    front = FrontEnd(input_ms=2.0, output_ms=1.0, busy_hop_residual_ms=((1, spread),))
    hop = replace(inputs, frontend=front, busy_hop_levels=levels)
    gap = replace(hop, spread_tail=True).scheduler_arrival_s(running) - hop.scheduler_arrival_s(
        running
    )
    assert gap == pytest.approx(np.full(n, rise * np.log(10.0) / 1e3))
    every = replace(inputs, frontend=replace(front, input_residual_ms=((0, spread),)),
                    input_spread_levels=levels, input_spread_idle_only=False)  # fmt: skip
    moved = replace(every, spread_tail=True).scheduler_arrival_s(running)
    assert moved - every.scheduler_arrival_s(running) == pytest.approx(gap)  # every send's too


@pytest.mark.parametrize("pause", [True, False])
def test_the_simulation_request_carries_the_serving_knobs(root: Path, pause: bool) -> None:
    """``vidur.intake_pause``, ``vidur.intake_step`` and the spreads reach the simulation as set."""
    import dataclasses

    from gpu_simulate_test.vidur_simulate.stage import _request

    write_synthetic_bundle(root / "profiles", QWEN3_TINY)
    cfg = stage(root)
    cfg = dataclasses.replace(
        cfg,
        vidur=dataclasses.replace(
            cfg.vidur, intake_pause=pause, busy_spread=not pause, intake_step=not pause
        ),
    )
    request = _request(cfg, prepare(cfg), None, None, None)
    assert request.intake_pause is pause and request.busy_spread is not pause
    assert request.intake_step is not pause


def test_the_named_reprofile_covers_what_the_simulation_needs(tmp_path: Path) -> None:
    # orca batches 8 whole 1,050-token requests: 8,400 tokens, beyond the default 4,096 and
    # the workload's longest prompt (all that workload_dir= widens a profile to)
    write_workload_run(tmp_path, "w", [1000] * 8, [50] * 8, [0.0] * 8)
    where = write_synthetic_bundle(tmp_path / "profiles", QWEN3_TINY, points=6)
    with pytest.raises(ArtifactError, match=r"tokens per batch: needs 8400") as err:
        prepare(stage(tmp_path, name="orca", batch_size_cap=8))
    message = str(err.value)
    assert f"profiling_root={tmp_path / 'profiles'} " in message
    overrides = dict(re.findall(r"profile\.(\w+)=(\d+)", message))
    ranges = resolve_ranges(
        ProfileRangesConfig(**{k: int(v) for k, v in overrides.items()}), QWEN3_TINY
    )
    assert ranges.max_num_tokens >= 8400
    # every range named, the bundle's where it covers: a range left out would fall back to the
    # config's default, narrower than a bundle widened before
    assert set(overrides) == {"max_num_tokens", "max_batch_size", "max_prefill_chunk",
                              "max_kv_cache_size"}  # fmt: skip
    have = load_bundle(where, timings_checked=False).ranges
    assert int(overrides["max_batch_size"]) == have.max_batch_size  # covered: the bundle's own
