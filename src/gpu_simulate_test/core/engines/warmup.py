"""The shape warm-up: an engine's first step of a new size pays one-time costs (on vLLM CPU,
oneDNN's kernels per token count) that a serving engine has long paid, so before the clock
starts the real bench, and the engine calibration before its experiments, send one
single-token request per step size the run can meet (``backend.warmup_shapes``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from gpu_simulate_test.core.engines.records import BenchRequest

SHAPE_WARMUP_MAX = 512
"""The most step sizes the shape warm-up visits (evenly spaced beyond, the workload's own
prompt lengths among them)."""


def warmup_sizes(
    longest_prompt: int, longest_total: int, max_batch_tokens: int, max_requests_per_batch: int
) -> list[int]:
    """The step sizes (tokens) a replay can meet: 1 to min(``max_batch_tokens``, the longest
    prompt + ``max_requests_per_batch``, the longest request − 1, which the model's context
    holds), at most :data:`SHAPE_WARMUP_MAX` of them, evenly spaced beyond."""
    top = max(1, min(max_batch_tokens, longest_prompt + max_requests_per_batch, longest_total - 1))
    if top <= SHAPE_WARMUP_MAX:
        return list(range(1, top + 1))
    return sorted({int(v) for v in np.linspace(1, top, SHAPE_WARMUP_MAX)})


def shape_warmup_requests(
    requests: Sequence[BenchRequest],
    max_batch_tokens: int,
    max_requests_per_batch: int,
    vocab_size: int,
    first_id: int = -1,
    seed: int | None = None,
) -> list[BenchRequest]:
    """One single-token request per step size the replay can meet (``backend.warmup_shapes``,
    :func:`warmup_sizes`, the workload's own prompt lengths among them), with fresh random
    prompts and ids from ``first_id`` down; none for text prompts (their token counts are not
    exact)."""
    if not requests or any(r.prompt_token_ids is None for r in requests):
        return []
    longest = max(r.num_prefill_tokens for r in requests)
    sizes = set(
        warmup_sizes(
            longest,
            max(r.total_tokens for r in requests),
            max_batch_tokens,
            max_requests_per_batch,
        )
    )
    sizes |= {r.num_prefill_tokens for r in requests if r.num_prefill_tokens <= max(sizes)}
    rng = np.random.default_rng(seed)
    return single_token_requests(
        sorted(sizes),
        lambda size: tuple(int(t) for t in rng.integers(0, min(vocab_size, 151643), size)),
        first_id,
    )


def single_token_requests(
    sizes: Sequence[int], prompt: Callable[[int], tuple[int, ...]], first_id: int = -1
) -> list[BenchRequest]:
    """A single-token request per size, its prompt from ``prompt(size)``, ids from ``first_id``
    down (the warm-up's, apart from any workload's)."""
    return [
        BenchRequest(
            request_id=first_id - i,
            num_prefill_tokens=size,
            num_decode_tokens=1,
            scheduled_arrival_s=0.0,
            prompt_token_ids=prompt(size),
        )
        for i, size in enumerate(sizes)
    ]
