"""Bursts and long contexts in the engine calibration (issue 46, item 2): 2, 4 and 8 prompts sent
at once become rows by what each step carried, decodes are timed at the middle and longest
context, and the overhead fit tells the per-prompt term from the per-token one on them."""

from __future__ import annotations

import pandas as pd
import pytest

from gpu_simulate_test.calibration.experiments import (
    BURST_PROMPTS,
    Experiment,
    decode_contexts,
    plan_experiments,
)
from gpu_simulate_test.calibration.overhead import fit, prompts_of, step_shape
from gpu_simulate_test.calibration.step_times import (
    burst_from_tokens,
    decode_medians_ms,
    step_log_samples,
    step_rows,
)
from gpu_simulate_test.config.backends import HfCbBackendConfig, HfGenerateBackendConfig
from gpu_simulate_test.config.vidur import EngineCalibrationConfig
from gpu_simulate_test.core.engines.records import BenchRequest, Recorder


def test_bursts_and_long_contexts_are_planned_within_one_step() -> None:
    cfg = EngineCalibrationConfig(backend=HfCbBackendConfig(max_num_batched_tokens=128), repeats=1)
    exps = set(plan_experiments(cfg, max_prompt_tokens=256))
    bursts = {e for e in exps if e.phase == "burst"}
    budget, cap = cfg.backend.step_limits()
    assert bursts, "bursts are planned by default"
    assert {e.num_prompts for e in bursts} <= set(BURST_PROMPTS)
    assert {e.batch_size for e in bursts} == {0, 4}  # on an idle engine and next to decodes
    for e in bursts:  # every burst fits one step's token budget and batch
        assert e.num_prompts * e.prompt_tokens + e.batch_size <= budget
        assert e.batch_size + e.num_prompts <= cap
    # the shortest prompt, and the longest of which two fit a step (of 16, 32, 64, 128: 64
    # alone, 32 beside 4 decodes)
    assert {(e.num_prompts, e.prompt_tokens) for e in bursts if e.batch_size == 0} == {
        (2, 16), (4, 16), (8, 16), (2, 64)}  # fmt: skip
    assert {(e.num_prompts, e.prompt_tokens) for e in bursts if e.batch_size == 4} == {
        (2, 16), (4, 16), (2, 32)}  # fmt: skip
    # decodes at the short context for every batch, at the middle and longest for a few
    contexts = decode_contexts(cfg.decode_prompt_tokens, 256, cfg.decode_tokens)
    assert contexts == ((32 + 240) // 2, 240)
    by_context = {c: {e.batch_size for e in exps if e.phase == "decode" and e.prompt_tokens == c}
                  for c in (32, *contexts)}  # fmt: skip
    assert by_context[240] == {1, 4, 16, cap} and len(by_context[32]) > len(by_context[240])
    off = EngineCalibrationConfig(
        backend=HfCbBackendConfig(max_num_batched_tokens=128), bursts=False
    )
    assert not any(e.phase == "burst" for e in plan_experiments(off, 256))
    sequential = EngineCalibrationConfig(backend=HfGenerateBackendConfig(), repeats=1)
    assert not any(e.phase == "burst" for e in plan_experiments(sequential, 256))
    # a short profile leaves no room for a longer context
    assert decode_contexts(32, 64, 16) == ()


def logged(compositions: list[tuple[int, int, int]], start: float = 1.0) -> pd.DataFrame:
    """Back-to-back logged steps (prompts, prompt tokens, decodes), 10 ms each."""
    rows = []
    t = start
    for prompts, tokens, decodes in compositions:
        t += 0.010
        rows.append(
            {
                "time_s": t,
                "num_prefill_requests": prompts,
                "num_prefill_tokens": tokens,
                "num_decode_requests": decodes,
                "num_decode_tokens": decodes,
                "elapsed_ms": 9.5,
            }
        )
    return pd.DataFrame(rows)


def test_a_burst_s_steps_become_rows_by_what_they_carried() -> None:
    burst = Experiment("burst", 0, 16, 32, num_prompts=4)
    # the first prompt wakes the engine alone; the other three then join its decode; then
    # decodes only; a chunk of a prompt is not a whole prompt and is left out
    steps = logged([(1, 16, 0), (3, 48, 1), (0, 0, 4), (2, 24, 2)])
    samples = step_log_samples([burst], [1.0], steps, decode_tokens=16)
    assert len(samples) == 1
    ((row, times),) = samples.items()
    assert (row.phase, row.batch_size, row.num_prompts, row.prompt_tokens) == ("mixed", 1, 3, 16)
    assert row.num_requests == 4 and row.context_tokens == 17  # a newcomer: its prompt and one
    assert times == pytest.approx([0.010])  # back to back: the period between log lines
    table = step_rows("vllm", samples, 16)
    assert table.loc[0, "num_prompts"] == 3 and table.loc[0, "context_tokens"] == 17
    q, kv = step_shape(next(table.itertuples()))
    assert q == [16, 16, 16, 1] and kv == [16, 16, 16, 17]
    # next to its own 4 decoders (a third into their 16 outputs: context 32 + 5 + 1)
    joined = Experiment("burst", 4, 16, 32, num_prompts=2)
    samples = step_log_samples([joined], [1.0], logged([(0, 0, 4), (2, 32, 4)]), 16)
    ((row, _),) = samples.items()
    assert (row.batch_size, row.num_prompts, row.context_tokens) == (4, 2, 38)


def records_of(
    exp: Experiment, firsts: list[float], arrival: float = 1.0
) -> tuple[list[BenchRequest], Recorder]:
    group = [BenchRequest(i, exp.prompt_tokens, 4, 0.0) for i in range(exp.num_requests)]
    rec = Recorder(group)
    for r, first in zip(group[-exp.num_prompts :], firsts, strict=True):
        rec.records[r.request_id].arrival_s = arrival
        rec.records[r.request_id].event_times_s = [first, first + 0.01]
    return group, rec


def test_the_client_sees_a_burst_s_step_only_when_one_step_carried_it_all() -> None:
    exp = Experiment("burst", 0, 64, 32, num_prompts=4)
    group, rec = records_of(exp, [1.0203, 1.0204, 1.0203, 1.0205])
    records = [rec.records[r.request_id] for r in group]
    ((row, sample),) = burst_from_tokens(exp, records, 16)
    assert (row.phase, row.batch_size, row.num_prompts) == ("prefill", 4, 4)
    assert sample == pytest.approx(0.0205)  # arrival to the last first token
    group, rec = records_of(exp, [1.0203, 1.0204, 1.0403, 1.0405])  # two steps
    assert burst_from_tokens(exp, [rec.records[r.request_id] for r in group], 16) == []


def test_the_fit_tells_the_per_prompt_term_from_the_per_token_one() -> None:
    """Overhead beyond a flat 1 ms of ops: requests 10 + 0.5 N, each prompt 2.5 more, each
    prompt token 0.02 more; one-prompt rows at 16 and 64 tokens, burst rows of 2, 4 and 8."""

    def row(phase: str, batch: int, q: int, prompts: int, ms: float) -> dict[str, object]:
        return {"backend": "vllm", "phase": phase, "batch_size": batch, "num_q_tokens": q,
                "context_tokens": q if phase == "prefill" else 40, "step_ms": ms,
                "samples": 3, "num_prompts": prompts}  # fmt: skip

    def cost(n: int, prompts: int, q: int) -> float:
        return 1 + 10 + 0.5 * n + 2.5 * prompts + 0.02 * prompts * q

    rows = [row("decode", b, 1, 1, 1 + 10 + 0.5 * b) for b in (1, 2, 4, 8, 12)]
    rows += [row("mixed", 1 + 1, q, 1, cost(2, 1, q)) for q in (16, 64)]
    rows += [row("mixed", 1 + k, 16, k, cost(1 + k, k, 16)) for k in (2, 4, 8)]
    rows += [row("prefill", 1, q, 1, cost(1, 1, q) + 3.0) for q in (16, 64)]  # + waking up
    overhead, table = fit("vllm", pd.DataFrame(rows), lambda _q, _kv: 1.0)
    assert overhead.per_prefill_request_ms == pytest.approx(2.5, rel=1e-4)
    assert overhead.per_prefill_token_ms == pytest.approx(0.02, rel=1e-4)
    assert overhead.idle_prefill_ms == pytest.approx(3.0, rel=1e-4)
    assert table["error"].abs().max() < 1e-6
    assert list(table["num_prompts"]) == [0] * 5 + [1, 1, 2, 4, 8, 1, 1]
    # read as one prompt of 16 tokens each, the bursts would have been charged one prompt's cost
    one = pd.DataFrame([{**r, "num_prompts": 1} for r in rows])
    _, wrong = fit("vllm", one, lambda _q, _kv: 1.0)
    assert wrong["error"].abs().max() > 0.1


def test_decode_medians_for_the_capacity_estimate_stay_at_the_short_context() -> None:
    samples = {
        Experiment("decode", 4, 32): [0.010, 0.010],
        Experiment("decode", 4, 240): [0.030, 0.030],
        Experiment("prefill", 1, 64): [0.020],
    }
    assert decode_medians_ms(samples) == {4: pytest.approx(10.0)}


def test_a_bundle_without_num_prompts_reads_one_prompt_per_row(tmp_path: object) -> None:
    from pathlib import Path

    from gpu_simulate_test.core.profiling.bundle import ENGINE_STEPS_TABLE
    from gpu_simulate_test.io.artifacts import read_csv, write_csv

    path = Path(str(tmp_path)) / "engine_steps.csv"
    common = {"backend": "vllm", "num_q_tokens": 16, "samples": 3}
    frame = pd.DataFrame(
        [
            {**common, "phase": "prefill", "batch_size": 1, "context_tokens": 16, "step_ms": 5.0},
            {
                **common,
                "phase": "mixed",
                "batch_size": 3,
                "context_tokens": 40,
                "step_ms": 9.0,
                "num_prompts": 2,
            },
        ]
    )
    write_csv(path, frame, ENGINE_STEPS_TABLE)
    back = read_csv(path, ENGINE_STEPS_TABLE)
    assert "num_prompts" in back.columns
    given = back["num_prompts"].tolist()
    assert pd.isna(given[0]) and given[1] == 2
    assert [prompts_of(r) for r in back.itertuples()] == [1, 2]
