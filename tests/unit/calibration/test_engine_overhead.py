"""The engine-overhead fit, its use in a batch's execution time, and the calibration plan."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from gpu_simulate_test.calibration.experiments import (
    auto_batch_sizes,
    auto_prompt_lengths,
    plan_experiments,
)
from gpu_simulate_test.calibration.overhead import (
    ExecutionTimeWithOverhead,
    StepJitter,
    StepOverhead,
    fit,
)
from gpu_simulate_test.config.backends import HfCbBackendConfig, HfGenerateBackendConfig
from gpu_simulate_test.config.schema import ConfigError
from gpu_simulate_test.config.vidur import EngineCalibrationConfig, VidurConfig
from gpu_simulate_test.core.profiling.bundle import ENGINE_STEPS_TABLE, load_bundle
from gpu_simulate_test.io import layout
from gpu_simulate_test.io.artifacts import ArtifactError, write_csv, write_json
from tests.vidur_bundle_factory import QWEN3_TINY, write_synthetic_bundle

OPS_MS = 1.0
"""What the stand-in for Vidur's prediction says every batch costs."""


def steps(backend: str = "hf_cb", decode: dict[int, float] | None = None) -> pd.DataFrame:
    """Calibration rows whose overhead beyond OPS_MS is known: per-request part 10 + 0.5 N (or
    ``decode``), a prefill 2.5 + 0.02 P more: 13 + 0.02 P for one prompt."""
    decode = decode or {b: 10 + 0.5 * b for b in (1, 2, 4, 8)}
    rows = [("prefill", 1, p, p, OPS_MS + 13 + 0.02 * p) for p in (16, 64, 256)] + [
        ("decode", b, 1, 50, OPS_MS + ms) for b, ms in decode.items()
    ]
    return pd.DataFrame(
        [
            {
                "backend": backend,
                "phase": phase,
                "batch_size": b,
                "num_q_tokens": q,
                "context_tokens": kv,
                "step_ms": ms,
                "samples": 4,
            }
            for phase, b, q, kv, ms in rows
        ]
    )


def flat(_q: list[int], _kv: list[int]) -> float:
    return OPS_MS


def test_fit_recovers_a_known_overhead_and_predicts_mixed_batches() -> None:
    overhead, table = fit("hf_cb", steps(), flat)
    assert overhead.base_ms == pytest.approx(10, rel=1e-6)
    assert overhead.per_request_ms == pytest.approx(0.5, rel=1e-6)
    assert overhead.per_prefill_request_ms == pytest.approx(2.5, rel=1e-6)
    assert overhead.per_prefill_token_ms == pytest.approx(0.02, rel=1e-6)
    assert overhead.idle_prefill_ms == 0  # no mixed steps: nothing to tell it apart
    assert table["error"].abs().max() < 1e-6
    # a chunk of 100 prompt tokens next to 3 decodes: requests(4) + 2.5 + 0.02 * 100
    assert overhead.ms([100, 1, 1, 1]) == pytest.approx(10 + 2 + 2.5 + 2)
    assert overhead.ms([1] * 16) == pytest.approx(10 + 0.5 * 16)  # beyond 8: the fitted slope


def with_wake_up_and_mixed(prompts: tuple[int, ...]) -> pd.DataFrame:
    """``steps()`` with an idle engine's prefill 5 ms dearer (the wake-up), plus mixed steps: a
    prompt of each length joining 1 or 4 decodes, 2.5 + 0.02 P beyond requests(N)."""
    rows = steps()
    rows.loc[rows["phase"] == "prefill", "step_ms"] += 5.0
    mixed = pd.DataFrame(
        [
            {
                "backend": "hf_cb",
                "phase": "mixed",
                "batch_size": b + 1,
                "num_q_tokens": p,
                "context_tokens": 43,
                "step_ms": OPS_MS + 10 + 0.5 * (b + 1) + 2.5 + 0.02 * p,
                "samples": 8,
            }
            for b in (1, 4)
            for p in prompts
        ]
    )
    return pd.concat([rows, mixed], ignore_index=True)


def test_mixed_steps_separate_the_idle_engines_wake_up() -> None:
    """A prompt next to decodes costs 2.5 + 0.02 P beyond requests(N); on an idle engine it
    costs 5 more (the wake-up), which only batches without decodes pay."""
    overhead, table = fit("hf_cb", with_wake_up_and_mixed((16, 256)), flat)
    assert overhead.per_prefill_request_ms == pytest.approx(2.5, rel=1e-6)
    assert overhead.per_prefill_token_ms == pytest.approx(0.02, rel=1e-6)
    assert overhead.idle_prefill_ms == pytest.approx(5, rel=1e-6)
    assert table["error"].abs().max() < 1e-6
    assert overhead.ms([64]) == pytest.approx(10.5 + 5 + 2.5 + 0.02 * 64)  # idle engine
    assert overhead.ms([64, 1]) == pytest.approx(11 + 2.5 + 0.02 * 64)  # busy engine


def test_prompt_slope_comes_from_every_prompt_carrying_step() -> None:
    """Mixed steps at one prompt length (the longer one left out as beyond the simulation) give
    no slope on their own; the idle prefills' lengths carry it, the mixed steps the wake-up."""
    overhead, table = fit("hf_cb", with_wake_up_and_mixed((16,)), flat)
    assert overhead.per_prefill_request_ms == pytest.approx(2.5, rel=1e-6)
    assert overhead.per_prefill_token_ms == pytest.approx(0.02, rel=1e-6)
    assert overhead.idle_prefill_ms == pytest.approx(5, rel=1e-6)
    assert table["error"].abs().max() < 1e-6


# A real calibration (hf_cb, tiny Qwen3, one CPU thread, 2026-11-23): measured step and Vidur's
# ops (ms). Its mixed steps all had a 16-token prompt; fitting the slope on them alone put
# 0.22 ms on every prompt token and predicted the 102-token prefill at 36.7 ms (twice the truth).
REAL_ROWS = [
    ("prefill", 1, 16, 16, 16.446, 1.299),
    ("prefill", 1, 40, 40, 16.259, 1.609),
    ("prefill", 1, 102, 102, 18.243, 2.617),
    *[
        ("decode", b, 1, 44, ms, ops)
        for b, ms, ops in [
            (1, 12.971, 1.044),
            (2, 25.179, 1.057),
            (3, 31.553, 1.062),
            (4, 22.553, 1.074),
            (5, 17.030, 1.074),
            (6, 31.214, 1.086),
            (7, 42.382, 1.087),
            (8, 25.001, 1.097),
        ]
    ],
    ("mixed", 2, 16, 38, 25.315, 1.485),
    ("mixed", 5, 16, 38, 24.457, 1.515),
]


def test_a_real_calibration_is_fitted_within_its_noise() -> None:
    rows, vidur = calibration(REAL_ROWS)
    overhead, table = fit("hf_cb", rows, vidur)
    prefill = table[table["phase"] == "prefill"]
    assert prefill["error"].abs().max() < 0.05  # was +101% at 102 tokens
    assert overhead.per_prefill_token_ms < 0.05
    assert table["error"].abs().max() < 0.2  # the mixed steps: about +-15%


GRAPH_ROWS = [
    # (phase, requests, query tokens, context, measured step ms, Vidur's ops ms): hf_cb with CUDA
    # graphs, Qwen3-0.6B in bf16 on an H200 (benchmarks/results/h200_qwen3_0_6b_20261126): every
    # step about 22-25 ms, while the ops profiled one by one add up to 26-30 ms
    ("prefill", 1, 16, 16, 22.53, 27.93),
    ("prefill", 1, 51, 51, 22.20, 28.52),
    ("prefill", 1, 161, 161, 22.74, 27.44),
    ("prefill", 1, 512, 512, 23.72, 28.42),
    ("decode", 1, 1, 44, 22.34, 25.71),
    ("decode", 2, 1, 44, 22.32, 25.88),
    ("decode", 4, 1, 44, 22.36, 25.69),
    ("decode", 8, 1, 44, 22.90, 26.10),
    ("decode", 16, 1, 44, 23.07, 25.64),
    ("decode", 32, 1, 44, 24.60, 25.94),
    ("mixed", 2, 16, 38, 23.06, 29.52),
    ("mixed", 2, 512, 38, 22.95, 29.50),
    ("mixed", 5, 16, 38, 22.99, 29.50),
    ("mixed", 5, 512, 38, 22.50, 29.49),
]


def calibration(
    real_rows: list[tuple[str, int, int, int, float, float]],
) -> tuple[pd.DataFrame, Callable[[list[int], list[int]], float]]:
    """``engine_steps`` rows of a real calibration and Vidur's ops for their shapes."""
    rows = pd.DataFrame(
        [
            {
                "backend": "hf_cb",
                "phase": phase,
                "batch_size": b,
                "num_q_tokens": q,
                "context_tokens": kv,
                "step_ms": ms,
                "samples": 8,
            }
            for phase, b, q, kv, ms, _ in real_rows
        ]
    )
    ops = {(b, q): ops_ms for _, b, q, _, _, ops_ms in real_rows}  # (requests, longest query)

    def vidur(q: list[int], _kv: list[int]) -> float:
        return ops[(len(q), max(q))]

    return rows, vidur


GRAPH_ROWS_PROMPTS_ONLY = [
    # the same preset calibrated again on the H200: the layer profile (eager, launch-bound) now
    # put a decode's ops below the measured step and only the prompts' above it
    ("prefill", 1, 16, 16, 23.51, 22.23),
    ("prefill", 1, 51, 51, 23.27, 26.51),
    ("prefill", 1, 161, 161, 23.76, 23.94),
    ("prefill", 1, 512, 512, 24.74, 24.84),
    ("decode", 1, 1, 44, 22.60, 19.82),
    ("decode", 2, 1, 44, 22.97, 19.97),
    ("decode", 4, 1, 44, 22.78, 20.01),
    ("decode", 8, 1, 44, 23.57, 19.89),
    ("decode", 16, 1, 44, 24.05, 19.38),
    ("decode", 32, 1, 44, 25.21, 20.43),
    ("mixed", 2, 16, 38, 23.16, 23.66),
    ("mixed", 2, 512, 38, 23.02, 25.03),
    ("mixed", 5, 16, 38, 22.95, 23.85),
    ("mixed", 5, 512, 38, 23.63, 25.22),
]


def room_ratios(overhead: StepOverhead, table: pd.DataFrame) -> pd.Series:
    """Per step with a prompt: what its measured time leaves beside requests(N), over its ops."""
    prompts = table[table["phase"] != "decode"]
    beside = prompts["batch_size"].map(lambda n: overhead.requests_ms(int(n)))
    return (prompts["measured_ms"] - beside) / prompts["vidur_ops_ms"]


def test_ops_faster_in_the_engine_than_profiled_are_scaled_not_left_too_slow() -> None:
    """With CUDA graphs the engine's steps beat the sum of the ops timed one by one; the overhead
    cannot be negative, so the ops are scaled down, decodes to the fastest decode's ratio and
    steps with a prompt to the smallest room they leave beside requests(N); every decode step
    is then fitted exactly (unscaled, all were 12-16% too slow, and the prompts' steps
    19-31%)."""
    rows, vidur = calibration(GRAPH_ROWS)
    overhead, table = fit("hf_cb", rows, vidur)
    assert overhead.ops_scale == pytest.approx(22.32 / 25.88)  # the fastest decode: 2 requests
    assert overhead.prompt_ops_scale == pytest.approx(room_ratios(overhead, table).min())
    assert 0.7 < overhead.prompt_ops_scale < 0.8
    decode = table["phase"] == "decode"
    assert (table.loc[decode, "ops_scale"] == overhead.ops_scale).all()
    assert (table.loc[~decode, "ops_scale"] == overhead.prompt_ops_scale).all()
    assert overhead.scale_for([1, 1]) == overhead.ops_scale
    assert overhead.scale_for([16, 1]) == overhead.prompt_ops_scale
    assert (table["vidur_ops_ms"] == [r[5] for r in GRAPH_ROWS]).all()  # as Vidur predicts
    assert table.loc[decode, "error"].abs().max() < 1e-6
    assert table["error"].abs().max() < 0.05
    assert (table["overhead_ms"] >= 0).all()
    # the simulated step: the scaled ops plus the overhead, as the calibration measured it
    step = ExecutionTimeWithOverhead(
        SimpleNamespace(total_time=25.69e-3), overhead.ms([1] * 4), ops_scale=overhead.ops_scale
    )
    assert step.total_time * 1e3 == pytest.approx(22.36, abs=1e-6)


def test_only_the_prompts_ops_are_scaled_when_only_they_exceed_the_steps() -> None:
    """Decodes leave their ops room (ops kept), the prompts' steps do not once requests(N) is
    beside them: unscaled, those were simulated 6-26% too slow; scaled, within 10% (the
    profile's own ops are not monotone in prompt length: 22.2, 26.5, 23.9 ms at 16, 51, 161)."""
    rows, vidur = calibration(GRAPH_ROWS_PROMPTS_ONLY)
    overhead, table = fit("hf_cb", rows, vidur)
    assert overhead.ops_scale == 1.0
    assert overhead.prompt_ops_scale == pytest.approx(room_ratios(overhead, table).min())
    assert overhead.prompt_ops_scale < 0.85
    assert table["error"].abs().max() < 0.1
    assert table.loc[table["phase"] == "mixed", "error"].abs().max() < 0.05


def test_ops_are_kept_as_profiled_when_the_engine_is_slower_than_them() -> None:
    overhead, _ = fit("hf_cb", steps(), flat)
    assert overhead.ops_scale == overhead.prompt_ops_scale == 1.0
    rows, vidur = calibration(REAL_ROWS)
    fitted = fit("hf_cb", rows, vidur)[0]
    assert fitted.ops_scale == fitted.prompt_ops_scale == 1.0


def test_per_request_overhead_follows_the_engine_between_calibrated_sizes() -> None:
    """Engines are not linear in batch size (hf_cb on CPU: slower at 2 than at 4)."""
    overhead, table = fit("hf_cb", steps(decode={1: 12.0, 2: 27.0, 4: 25.0, 8: 26.0}), flat)
    decode = table[table["phase"] == "decode"]
    assert decode["error"].abs().max() < 1e-9
    assert overhead.ms([1, 1]) == pytest.approx(27.0)
    assert overhead.ms([1, 1, 1]) == pytest.approx(26.0)  # halfway between 2 and 4


def test_fit_leaves_out_steps_without_a_prediction_and_needs_both_phases() -> None:
    def no_big_batches(q: list[int], kv: list[int]) -> float:
        if len(q) > 2:
            raise KeyError(len(q))
        return OPS_MS

    overhead, table = fit("hf_cb", steps(), no_big_batches)
    assert sorted(table["batch_size"]) == [1, 1, 1, 1, 2]
    assert overhead.batch_sizes == (1, 2)
    only_prefill = steps().query("phase == 'prefill'")
    with pytest.raises(ValueError, match="prefill and decode"):
        fit("hf_cb", only_prefill, flat)


def test_execution_time_carries_the_overhead_in_total_time_only() -> None:
    base = SimpleNamespace(total_time=0.002, model_time=0.002, num_layers=2)
    wrapped = ExecutionTimeWithOverhead(base, 3.0)
    assert wrapped.total_time == pytest.approx(0.005)
    assert wrapped.model_time == pytest.approx(0.002)
    assert wrapped.num_layers == 2
    assert wrapped.to_dict()["engine_overhead_time"] == 3.0
    jittered = ExecutionTimeWithOverhead(base, 3.0, factor=1.5)  # the whole step stretches
    assert jittered.total_time == pytest.approx(0.0075)
    assert jittered.model_time == pytest.approx(0.002)
    assert jittered.to_dict()["jitter_factor"] == 1.5


SPREAD = {"percentiles": [0, 50, 90, 100], "ratios": [0.9, 1.0, 1.2, 2.0]}


def test_step_jitter_draws_follow_the_recorded_spread() -> None:
    jitter = StepJitter.from_calibration(SPREAD, "meta.json")
    # the inverse CDF's integral: 0.5 * 0.95 + 0.4 * 1.1 + 0.1 * 1.6
    assert jitter.mean_ratio == pytest.approx(1.075)
    draw = jitter.sampler(seed=7)
    draws = np.array([draw() for _ in range(20_000)])
    assert np.median(draws) == pytest.approx(1.0, abs=0.01)
    assert np.percentile(draws, 90) == pytest.approx(1.2, abs=0.02)
    assert draws.mean() == pytest.approx(jitter.mean_ratio, rel=0.01)
    again = jitter.sampler(seed=7)
    assert [again() for _ in range(5)] == pytest.approx(draws[:5].tolist())  # seeded


@pytest.mark.parametrize(
    "recorded",
    [
        {"percentiles": [0, 100]},
        {"percentiles": [0, 50, 100], "ratios": [1.0, 1.1]},
        {"percentiles": [5, 50, 100], "ratios": [0.9, 1.0, 1.1]},
        {"percentiles": [0, 50, 100], "ratios": [1.0, 0.9, 1.1]},
        {"percentiles": [0, 100], "ratios": [0.0, 1.0]},
        None,
    ],
)
def test_step_jitter_refuses_a_spread_it_cannot_draw_from(recorded: object) -> None:
    with pytest.raises(ValueError, match=r"meta.json: expected"):
        StepJitter.from_calibration(recorded, "meta.json")


def test_bundle_engine_steps_name_the_missing_backend_and_bad_rows(tmp_path: Path) -> None:
    path = write_synthetic_bundle(tmp_path, QWEN3_TINY, points=6)
    with pytest.raises(ArtifactError, match="no engine calibration for backend 'hf_cb'"):
        load_bundle(path).engine_steps("hf_cb")
    meta = load_bundle(path).meta
    write_json(path / layout.BUNDLE_META, {**meta, "engine_calibration": {"hf_cb": {}}})
    bad = steps()
    bad.loc[0, "phase"] = "warmup"
    write_csv(path / layout.ENGINE_STEPS, bad, ENGINE_STEPS_TABLE)
    with pytest.raises(ArtifactError, match=r"engine_steps.csv.*'phase'.*warmup"):
        load_bundle(path).engine_steps("hf_cb")
    write_csv(path / layout.ENGINE_STEPS, steps(), ENGINE_STEPS_TABLE)
    assert len(load_bundle(path).engine_steps("hf_cb")) == 7
    with pytest.raises(ArtifactError, match="hf_generate"):
        load_bundle(path).engine_steps("hf_generate")


def test_calibration_plan_fits_the_engine() -> None:
    assert auto_batch_sizes(32) == (*range(1, 17), 20, 24, 28, 32)
    assert auto_batch_sizes(6) == (1, 2, 3, 4, 5, 6)
    assert auto_batch_sizes(30)[-3:] == (24, 28, 30)
    lengths = auto_prompt_lengths(256)
    assert lengths[0] == 16 and lengths[-1] == 256 and len(lengths) == 4
    cb = EngineCalibrationConfig(
        backend=HfCbBackendConfig(max_num_batched_tokens=128), repeats=2, bursts=False
    )
    exps = plan_experiments(cb, max_prompt_tokens=1024)  # bursts: test_burst_calibration.py
    assert max(e.prompt_tokens for e in exps if e.phase == "prefill") == 128  # one engine step
    mixed = sorted({(e.batch_size, e.prompt_tokens) for e in exps if e.phase == "mixed"})
    assert mixed == [(1, 16), (1, 128), (4, 16), (4, 128)]  # a prompt joins 1 or 4 decodes
    # prefill and mixed twice; decode batches until 64 steps are timed (8 gaps per request)
    decode_runs = [
        sum(1 for e in exps if e.phase == "decode" and e.batch_size == b and e.prompt_tokens == 32)
        for b in (1, 2, 3, 4)
    ]
    assert decode_runs == [8, 4, 3, 2]
    # and at the middle and longest context (520, 1008), batches 1 and 4 (16 and 32 need more
    # KV than hf_cb's 512 blocks hold there)
    longer = sorted({(e.batch_size, e.prompt_tokens) for e in exps if e.phase == "decode"} - {
        (e.batch_size, 32) for e in exps})  # fmt: skip
    assert longer == [(1, 520), (1, 1008), (4, 520), (4, 1008)]
    assert len(exps) == 2 * 4 + (8 + 4 + 3 + 2 * 17) + 2 * 4 + 2 * (8 + 2)
    # interleaved in rounds: every experiment once before any runs twice; only decode batch 1
    # (8 runs) is left for the last rounds
    first_round = exps[: len(set(exps))]
    assert len(set(first_round)) == len(first_round) == 4 + 20 + 4 + 4
    assert exps[-4:] == [e for e in exps if e.phase == "decode" and e.batch_size == 1][-4:]
    sequential = EngineCalibrationConfig(backend=HfGenerateBackendConfig(), repeats=1)
    assert {e.batch_size for e in plan_experiments(sequential, 512)} == {1}
    assert {e.phase for e in plan_experiments(sequential, 512)} == {"prefill", "decode"}
    with pytest.raises(ValueError, match=r"engine.batch_sizes \[4\]"):
        plan_experiments(
            EngineCalibrationConfig(backend=HfGenerateBackendConfig(), batch_sizes=(1, 4)),
            512,
        )
    with pytest.raises(ValueError, match=r"prompt_lengths \[512\] exceed 128"):
        plan_experiments(
            EngineCalibrationConfig(
                backend=HfCbBackendConfig(max_num_batched_tokens=128), prompt_lengths=(16, 512)
            ),
            1024,
        )


def test_engine_overhead_config_is_checked() -> None:
    with pytest.raises(ConfigError, match=r"vidur\.engine_overhead=.sglang."):
        VidurConfig(engine_overhead="sglang")
    with pytest.raises(ConfigError, match=r"engine\.decode_tokens"):
        EngineCalibrationConfig(decode_tokens=2)


def test_step_rows_read_step_times_off_the_recorded_tokens() -> None:
    """Prefill: arrival to first token; decode: the later half of the gaps; mixed: each
    decoder's gap that ends with the newcomer's first token."""
    from gpu_simulate_test.calibration.engine_steps import experiment_requests
    from gpu_simulate_test.calibration.experiments import Experiment
    from gpu_simulate_test.calibration.step_times import step_jitter, step_rows, step_samples
    from gpu_simulate_test.core.engines.records import STATUS_OK, Recorder

    exps = [
        Experiment("prefill", 1, 64),
        Experiment("decode", 2, 32),
        Experiment("mixed", 1, 128, decode_prompt_tokens=32),
    ]
    groups = experiment_requests(exps, decode_tokens=6, vocab_size=1000)
    recorder = Recorder([r for g in groups for r in g])

    def play(request_id: int, arrival: float, tokens: list[float]) -> None:
        recorder.arrived(request_id, arrival)
        for t in tokens:
            recorder.tokens(request_id, t)
        recorder.finish(request_id, STATUS_OK)

    play(0, 0.0, [0.020, 0.03, 0.04, 0.05, 0.06, 0.07])  # prefill: 20 ms
    for rid in (1, 2):  # decode: gaps 50 ms, then 10 ms in the later half
        play(rid, 1.0, [1.05, 1.10, 1.15, 1.16, 1.17, 1.18])
    play(3, 2.0, [2.01, 2.02, 2.03, 2.06, 2.07, 2.08])  # a decoder; the step with the
    play(4, 2.025, [2.06, 2.07, 2.08, 2.09, 2.10, 2.11])  # newcomer took 30 ms
    samples = step_samples(exps, groups, recorder)
    rows = step_rows("hf_cb", samples, decode_tokens=6).set_index("phase")
    assert rows.loc["prefill", "step_ms"] == pytest.approx(20)
    assert rows.loc["decode", "step_ms"] == pytest.approx(10)
    assert rows.loc["decode", "samples"] == 2 * 3
    assert rows.loc["mixed", "step_ms"] == pytest.approx(30)
    assert rows.loc["mixed", "batch_size"] == 2 and rows.loc["mixed", "num_q_tokens"] == 128
    # the decode gaps (10, 10, 10 ms per request) sit on their median: no spread
    jitter = step_jitter(samples)
    assert jitter is not None and jitter["samples"] == 6
    assert jitter["ratios"] == pytest.approx([1.0] * len(jitter["percentiles"]))


def test_step_jitter_weighs_decode_rows_alike_relative_to_their_median() -> None:
    from gpu_simulate_test.calibration.experiments import Experiment
    from gpu_simulate_test.calibration.step_times import step_jitter

    one, four = Experiment("decode", 1, 32), Experiment("decode", 4, 32)
    # batch 1: 3 of 4 steps at the median, 1 twice as long; batch 4 (its lockstep steps seen by
    # 4 requests, so 4 times the gaps, and one zero gap: two tokens in one event) never strays
    jitter = step_jitter({one: [0.1, 0.1, 0.1, 0.2], four: [0.0] + [0.01] * 16})
    assert jitter is not None
    assert (jitter["rows"], jitter["samples"]) == (2, 20)
    assert jitter["mean_ratio"] == pytest.approx((1.25 + 1.0) / 2)  # not pulled to 1 by 16 gaps
    by_percentile = dict(zip(jitter["percentiles"], jitter["ratios"], strict=True))
    assert by_percentile[50] == pytest.approx(1.0)
    assert by_percentile[0] == pytest.approx(1.0)  # the zero gap is left out
    assert by_percentile[100] == pytest.approx((2.0 + 1.0) / 2)
    assert step_jitter({Experiment("prefill", 1, 64): [0.02, 0.03]}) is None
