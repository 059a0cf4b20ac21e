"""The shape warm-up: one single-token request per step size a replay (or a calibration) can
meet, so that neither times an engine's first step of a size."""

from __future__ import annotations

import numpy as np

from gpu_simulate_test.calibration.engine_steps import calibration_shapes
from gpu_simulate_test.calibration.experiments import Experiment
from gpu_simulate_test.config.vidur import EngineCalibrationConfig
from gpu_simulate_test.core.engines.records import BenchRequest
from gpu_simulate_test.core.engines.warmup import (
    SHAPE_WARMUP_MAX,
    shape_warmup_requests,
    warmup_sizes,
)


def _req(i: int, prompt: int, output: int, tokens: bool = True) -> BenchRequest:
    ids = tuple(range(prompt)) if tokens else None
    return BenchRequest(i, prompt, output, 0.0, ids, None if tokens else "text")


def test_sizes_run_from_one_to_what_a_step_can_hold() -> None:
    # the longest prompt (100) plus a decode per other request in the batch (8)
    assert warmup_sizes(100, 132, 256, 8) == list(range(1, 109))
    # never past the batch token budget, nor past the longest request (its context holds that)
    assert warmup_sizes(100, 132, 64, 8)[-1] == 64
    assert warmup_sizes(100, 104, 256, 32)[-1] == 103
    # a long range: evenly spaced, both ends kept
    sizes = warmup_sizes(8000, 9000, 8192, 64)
    assert len(sizes) == SHAPE_WARMUP_MAX and sizes[0] == 1 and sizes[-1] == 8000 + 64


def test_warmup_requests_are_single_tokens_with_their_own_ids_and_prompts() -> None:
    requests = [_req(0, 30, 5), _req(1, 50, 3), _req(2, 700, 2)]
    warm = shape_warmup_requests(requests, 512, 4, vocab_size=1000, first_id=-3, seed=1)
    sizes = [r.num_prefill_tokens for r in warm]
    assert sizes == list(range(1, 513))  # 700 + 4 capped at the 512-token budget
    assert all(r.num_decode_tokens == 1 for r in warm)
    assert [r.request_id for r in warm[:2]] == [-3, -4]
    assert all(len(r.prompt_token_ids or ()) == r.num_prefill_tokens for r in warm)
    assert max(max(r.prompt_token_ids or (0,)) for r in warm) < 1000
    # a spaced range still visits the workload's own prompt lengths
    long = [_req(0, 4097, 2), _req(1, 3001, 2)]
    spaced = shape_warmup_requests(long, 8192, 4, vocab_size=1000)
    assert {3001, 4097} <= {r.num_prefill_tokens for r in spaced}
    # text prompts have no exact token count: no shape warm-up
    assert shape_warmup_requests([_req(0, 30, 5, tokens=False)], 512, 4, 1000) == []


def test_the_calibration_warms_what_its_experiments_and_replays_meet() -> None:
    cfg = EngineCalibrationConfig()
    experiments = [Experiment("prefill", 1, 64), Experiment("decode", 4, 32)]
    warm = calibration_shapes(cfg, experiments, vocab_size=1000)
    sizes = [r.num_prefill_tokens for r in warm]
    assert sizes[0] == 1 and sizes == sorted(set(sizes))
    # the longest request: the 64-token prompt and the replays' longest output (2 x 16 tokens)
    longest_total = 64 + 2 * cfg.decode_tokens
    budget, cap = cfg.backend.step_limits()
    assert sizes[-1] == min(budget, 64 + cap, longest_total - 1)
    assert all(r.request_id < 0 and r.num_decode_tokens == 1 for r in warm)
    # the served workload's longer prompts widen it
    lengths = (np.array([16, 200]), np.array([4, 8]))
    wider = calibration_shapes(cfg, experiments, 1000, lengths)
    assert wider[-1].num_prefill_tokens > sizes[-1] or sizes[-1] == budget
    off = EngineCalibrationConfig(backend=type(cfg.backend)(warmup_shapes=False))
    assert calibration_shapes(off, experiments, 1000) == []
