"""The engine calibration's prefill over a cached prefix (phase ``cached_prefill``): planned only
with vLLM's prefix caching, a primer that fills the cache before the timed request, the timed
request's step read and shaped as ``T`` query tokens over ``C + T`` KV, and its hit checked."""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import pandas as pd
import pytest

from gpu_simulate_test.calibration.common import windows
from gpu_simulate_test.calibration.engine_steps import (
    experiment_key,
    experiment_requests,
    prime,
    run_experiment,
)
from gpu_simulate_test.calibration.experiments import Experiment, plan_experiments
from gpu_simulate_test.calibration.overhead import fit, fit_report, step_shape
from gpu_simulate_test.calibration.step_times import (
    check_cache_hits,
    idle_prefills_from_stamps,
    step_log_samples,
    step_rows,
    step_samples,
)
from gpu_simulate_test.config.backends import HfCbBackendConfig, VllmBackendConfig
from gpu_simulate_test.config.vidur import EngineCalibrationConfig
from gpu_simulate_test.core.engines import BackendError
from gpu_simulate_test.core.engines.records import STATUS_OK, BenchRequest, Recorder
from gpu_simulate_test.core.profiling.bundle import ENGINE_PHASES


def cached(plan: Sequence[Experiment]) -> list[tuple[int, int]]:
    """The (C, T) of every distinct cached prefill of a plan, sorted."""
    return sorted({(e.cached_tokens, e.prompt_tokens) for e in plan if e.phase == "cached_prefill"})


def vllm(caching: bool | None = None) -> EngineCalibrationConfig:
    """vLLM at its defaults (blocks of 32, 256 tokens a step), prefix caching as given."""
    backend = (
        VllmBackendConfig() if caching is None else VllmBackendConfig(enable_prefix_caching=caching)
    )
    return EngineCalibrationConfig(backend=backend, repeats=2)


def test_cached_prefills_are_planned_only_with_prefix_caching() -> None:
    assert cached(plan_experiments(vllm(), 256)) == []
    assert cached(plan_experiments(vllm(caching=False), 256)) == []
    hf_cb = EngineCalibrationConfig(backend=HfCbBackendConfig(max_num_batched_tokens=256))
    phases = {e.phase for e in plan_experiments(hf_cb, 256)}
    assert phases == {"prefill", "decode", "mixed", "burst"}
    # prompts 16, 40, 102, 256 (one step of 256 tokens); C = 1/4 and 1/2 of 256, whole blocks
    # of 32; C + T within the 256 tokens the bundle covers leaves T = 16 only
    on = plan_experiments(vllm(caching=True), 256)
    assert cached(on) == [(64, 16), (128, 16)]
    # a bundle covering longer prompts takes the longest prefill over both prefixes too
    assert cached(plan_experiments(vllm(caching=True), 1024)) == [
        (64, 16),
        (64, 256),
        (128, 16),
        (128, 256),
    ]
    assert all(e.batch_size == 1 and e.num_requests == 1 for e in on if e.cached_tokens)
    # run as often as a prefill, each round right after the prefills (a primer runs before its
    # experiment starts, in the window before, which must take only that one's first prompt)
    assert sum(e.phase == "cached_prefill" for e in on) == 2 * 2
    first_round = on[: len(set(on))]
    assert [e.phase for e in first_round[:6]] == ["prefill"] * 4 + ["cached_prefill"] * 2


def test_cached_prefixes_are_whole_blocks_and_fit_the_bundle() -> None:
    cfg = EngineCalibrationConfig(
        backend=VllmBackendConfig(
            enable_prefix_caching=True, block_size=16, max_num_batched_tokens=100
        ),
        prompt_lengths=(10, 60, 100),
    )
    # limit 100: 25 and 50 rounded down to blocks of 16 are 16 and 48; 48 + 100 > 120 dropped
    assert cached(plan_experiments(cfg, 120)) == [(16, 10), (16, 100), (48, 10)]
    for c, _t in cached(plan_experiments(cfg, 120)):
        assert c % 16 == 0
    # under one block (40 // 4 and 40 // 2 against blocks of 32): no cached prefill at all
    short = EngineCalibrationConfig(
        backend=VllmBackendConfig(enable_prefix_caching=True, max_num_batched_tokens=40)
    )
    assert cached(plan_experiments(short, 256)) == []


def test_primer_and_timed_request_share_exactly_the_cached_prefix() -> None:
    exps = [
        Experiment("prefill", 1, 16),
        Experiment("cached_prefill", 1, 16, cached_tokens=64),
        Experiment("cached_prefill", 1, 16, cached_tokens=64),  # a repeat
        Experiment("cached_prefill", 1, 40, cached_tokens=128),
    ]
    groups = experiment_requests(exps, decode_tokens=8, vocab_size=1000)
    ids = [r.request_id for g in groups for r in g]
    assert ids == list(range(len(ids)))  # unique across all experiments
    assert [len(g) for g in groups] == [1, 2, 2, 2]
    for exp, (primer, timed) in zip(exps[1:], groups[1:], strict=True):
        c = exp.cached_tokens
        assert primer.prompt_token_ids is not None and timed.prompt_token_ids is not None
        assert primer.num_prefill_tokens == len(primer.prompt_token_ids) == c + 1
        assert timed.num_prefill_tokens == len(timed.prompt_token_ids) == c + exp.prompt_tokens
        assert primer.prompt_token_ids[:c] == timed.prompt_token_ids[:c]
        assert primer.prompt_token_ids[c] != timed.prompt_token_ids[c]  # nothing more shared
        assert primer.num_decode_tokens == timed.num_decode_tokens == 8
    # every run primes its own prefix: a repeat does not hit the run before it
    first, repeat = groups[1][1].prompt_token_ids, groups[2][1].prompt_token_ids
    assert first is not None and repeat is not None and first[:32] != repeat[:32]
    assert experiment_key(exps[1]) == ("cached_prefill", 1, 16, 64)
    assert experiment_key(exps[0]) == ("prefill", 1, 16)


class InstantBackend:
    """Serves each request at once: its first token 5 ms after submit, then 1 ms apart."""

    name = "instant"

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.submitted: list[tuple[int, bool]] = []  # (id, every earlier request done)
        self.clock = 0.0

    def submit(self, req: BenchRequest) -> None:
        sent = [r for r in self.recorder.records.values() if r.arrival_s is not None]
        done = all(r.is_done for r in sent)
        self.submitted.append((req.request_id, done))
        self.clock += 1.0
        self.recorder.arrived(req.request_id, self.clock)
        for k in range(req.num_decode_tokens):
            self.recorder.tokens(req.request_id, self.clock + 0.005 + 0.001 * k)
        self.recorder.finish(req.request_id, STATUS_OK)

    def failure(self) -> None:
        return None


def test_the_primer_ends_before_the_timed_request_is_sent() -> None:
    exps = [Experiment("prefill", 1, 16), Experiment("cached_prefill", 1, 16, cached_tokens=32)]
    groups = experiment_requests(exps, decode_tokens=4, vocab_size=1000)
    recorder = Recorder([r for g in groups for r in g])
    backend = InstantBackend(recorder)
    assert prime(backend, recorder, exps[0], groups[0], 5.0) == groups[0]
    assert backend.submitted == []  # a prefill has no primer
    timed = prime(backend, recorder, exps[1], groups[1], 5.0)
    assert list(timed) == [groups[1][1]]
    assert backend.submitted == [(1, True)] and recorder.records[1].is_done
    run_experiment(backend, recorder, exps[1], timed, 4, 5.0)
    assert backend.submitted == [(1, True), (2, True)]


def play(recorder: Recorder, rid: int, arrival: float, first: float) -> None:
    recorder.arrived(rid, arrival)
    for k in range(4):
        recorder.tokens(rid, first + 0.01 * k)
    recorder.finish(rid, STATUS_OK)


def test_a_cached_prefills_step_is_its_timed_requests() -> None:
    exp = Experiment("cached_prefill", 1, 16, cached_tokens=64)
    groups = experiment_requests([exp], decode_tokens=4, vocab_size=1000)
    recorder = Recorder(groups[0])
    play(recorder, 0, 0.0, 0.050)  # the primer: 50 ms to its first token
    play(recorder, 1, 1.0, 1.020)  # the timed request: 20 ms
    samples = step_samples([exp], groups, recorder)
    assert samples[exp] == pytest.approx([0.020])
    rows = step_rows("vllm", samples, decode_tokens=4)
    assert rows.to_dict("records") == [
        {
            "backend": "vllm",
            "phase": "cached_prefill",
            "batch_size": 1,
            "num_q_tokens": 16,
            "context_tokens": 64 + 16,
            "step_ms": pytest.approx(20.0),
            "samples": 1,
            "num_prompts": 1,
        }
    ]
    assert set(rows["phase"]) <= set(ENGINE_PHASES)
    # the engine's stamps of the timed request (queued to first token: 12 ms), not the primer's
    recorder.engine_times(0, arrival=recorder.origin + 0.001, token_times=[recorder.origin + 0.04])
    recorder.engine_times(1, arrival=recorder.origin + 1.004, token_times=[recorder.origin + 1.016])
    stamped = idle_prefills_from_stamps([exp], groups, recorder, samples)
    assert stamped[exp] == pytest.approx([0.012])


def test_a_cached_prefills_window_starts_after_its_primer() -> None:
    """The primer runs before the cached prefill starts, in the prefill's window before it: each
    takes its own prompt step, and the primer's steps count for neither."""
    prefill = Experiment("prefill", 1, 33)
    cached_prefill = Experiment("cached_prefill", 1, 16, cached_tokens=32)
    steps = pd.DataFrame(
        [  # time_s, prompt tokens, decoding requests, elapsed_ms
            (0.10, 33, 0, 7.0),  # the prefill
            (0.11, 0, 1, 2.0),
            (0.20, 33, 0, 9.0),  # the primer (33 prompt tokens, as the prefill's)
            (0.21, 0, 1, 2.0),
            (0.30, 16, 0, 5.0),  # the timed request
            (0.31, 0, 1, 2.0),
        ],
        columns=["time_s", "num_prefill_tokens", "num_decode_requests", "elapsed_ms"],
    )
    chosen = {
        exp: rows.tolist()
        for _, exp, rows in windows([prefill, cached_prefill], [0.0, 0.25], steps)
    }
    assert chosen == {prefill: [0, 2], cached_prefill: [4]}
    samples = step_log_samples([prefill, cached_prefill], [0.0, 0.25], steps)
    loop = 8.0  # the decode steps' gaps less their own time
    assert samples[prefill] == pytest.approx([(7.0 + loop) / 1000])
    assert samples[cached_prefill] == pytest.approx([(5.0 + loop) / 1000])


def test_a_hit_other_than_the_cached_prefix_is_refused() -> None:
    exp = Experiment("cached_prefill", 1, 16, cached_tokens=64)
    groups = experiment_requests(
        [Experiment("prefill", 1, 16), exp], decode_tokens=4, vocab_size=1000
    )
    exps = [Experiment("prefill", 1, 16), exp]
    recorder = Recorder([r for g in groups for r in g])
    check_cache_hits(exps, groups, recorder)  # nothing recorded: accepted
    timed = recorder.records[groups[1][1].request_id]
    timed.engine_cached_tokens = timed.cached_tokens = 64
    recorder.records[0].engine_cached_tokens = 0  # a prefill's hit is not checked
    check_cache_hits(exps, groups, recorder)
    timed.engine_cached_tokens = 32
    with pytest.raises(BackendError, match=r"16 tokens over a cached prefix of 64.*hit 32"):
        check_cache_hits(exps, groups, recorder)
    timed.engine_cached_tokens = None
    timed.cached_tokens = 0  # the server's usage: no hit at all
    with pytest.raises(BackendError, match=r"hit 0 cached tokens by the server's usage"):
        check_cache_hits(exps, groups, recorder)


def test_a_cached_prefill_row_is_shaped_and_fitted_as_an_idle_prefill() -> None:
    row = SimpleNamespace(phase="cached_prefill", batch_size=1, num_q_tokens=16, context_tokens=80)
    assert step_shape(row) == ([16], [80])
    prefill = SimpleNamespace(phase="prefill", batch_size=1, num_q_tokens=16, context_tokens=16)
    assert step_shape(prefill) == ([16], [16])
    # the prefills have one prompt length, so only the cached prefills' lengths give the fit its
    # per-token slope: a prompt alone on an idle engine costs 13 + 0.02 T beyond the ops
    shapes: list[tuple[list[int], list[int]]] = []

    def ops(q: list[int], kv: list[int]) -> float:
        shapes.append((q, kv))
        return 0.01 * sum(kv)  # attention over the KV there

    rows = pd.DataFrame(
        [
            ("prefill", 1, 16, 16, 0.16 + 13 + 0.02 * 16),
            ("prefill", 1, 16, 16, 0.16 + 13 + 0.02 * 16),
            ("cached_prefill", 1, 64, 128, 1.28 + 13 + 0.02 * 64),
            ("cached_prefill", 1, 256, 320, 3.2 + 13 + 0.02 * 256),
        ]
        + [("decode", b, 1, 50, 0.5 * b + 10 + 0.5 * b) for b in (1, 2, 4)],
        columns=["phase", "batch_size", "num_q_tokens", "context_tokens", "step_ms"],
    ).assign(backend="vllm", samples=3)
    overhead, table = fit("vllm", rows, ops)
    assert ([256], [320]) in shapes
    assert overhead.per_prefill_token_ms == pytest.approx(0.02, rel=1e-6)
    assert overhead.per_prefill_request_ms == pytest.approx(2.5, rel=1e-6)
    assert table["error"].abs().max() < 1e-6
    by_phase = fit_report(overhead, table)["calibration_error_by_phase"]
    assert by_phase["cached_prefill"]["steps"] == 2
