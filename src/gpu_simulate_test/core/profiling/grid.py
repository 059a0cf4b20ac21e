"""Which shapes a profile measures: the ranges it must cover and the grid points inside them.

Vidur's random-forest predictor does not extrapolate: it predicts general ops for every
``num_tokens`` in 1..max, decode attention for batch 1..cap x kv 0..max (step 64) and prefill
attention for chunk 32..max (step 32) x kv. So every axis holds its small values (where times
change fastest), a geometric and a linear sweep, and its maximum.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from gpu_simulate_test.config.schema import ConfigError, ModelConfig
from gpu_simulate_test.config.vidur import ProfileRangesConfig

SMALL_NUM_TOKENS: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32)
SMALL_BATCH_SIZES: tuple[int, ...] = (1, 2, 3, 4, 8)
SMALL_PREFILL_CHUNKS: tuple[int, ...] = (8, 16, 32, 64)
SMALL_KV_CACHE_SIZES: tuple[int, ...] = (0, 1, 16, 64, 128)
AUTO_NUM_POINTS: Mapping[str, int] = MappingProxyType({"cuda": 16, "cpu": 6})
"""``profile.num_points=0``: per device type (a CPU takes seconds per big attention shape)."""


@dataclass(frozen=True)
class Ranges:
    """The maxima a profile covers, after defaults (0 = model context) and workload widening."""

    max_num_tokens: int
    max_batch_size: int
    max_prefill_chunk: int
    max_kv_cache_size: int
    num_points: int


@dataclass(frozen=True)
class WorkloadExtent:
    """The longest request of a workload: what the profile must at least cover."""

    workload_id: str
    max_prompt_tokens: int
    max_total_tokens: int
    """Longest prompt + output of one request: the most KV-cache context it reaches."""
    path: str = ""
    """The workload run's directory (for messages; empty: not known)."""


@dataclass(frozen=True)
class ProfileGrid:
    """Every shape to time: per-token op sizes, decode batches and prefill chunks."""

    num_tokens: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    prefill_chunks: tuple[int, ...]
    kv_cache_sizes: tuple[int, ...]

    @property
    def decode_shapes(self) -> list[tuple[int, int]]:
        """``(batch_size, kv_cache_size)`` of every decode row."""
        return [(b, kv) for b in self.batch_sizes for kv in self.kv_cache_sizes]

    @property
    def prefill_shapes(self) -> list[tuple[int, int]]:
        """``(prefill_chunk_size, kv_cache_size)`` of every prefill row (batch 1)."""
        return [(c, kv) for c in self.prefill_chunks for kv in self.kv_cache_sizes]

    @property
    def num_shapes(self) -> int:
        return len(self.num_tokens) + len(self.decode_shapes) + len(self.prefill_shapes)


def resolve_ranges(
    cfg: ProfileRangesConfig,
    model: ModelConfig,
    device: str = "cpu",
    workload: WorkloadExtent | None = None,
) -> Ranges:
    """Fill ``max_kv_cache_size=0`` with the model's context and ``num_points=0`` per device,
    and widen the ranges to cover ``workload``."""
    max_kv = cfg.max_kv_cache_size or model.max_position_embeddings
    max_tokens, max_chunk = cfg.max_num_tokens, cfg.max_prefill_chunk
    if workload is not None:
        # a whole prompt may be one prefill (vllm scheduler) and the longest request's context
        # is what its last decode step attends over
        max_tokens = max(max_tokens, workload.max_prompt_tokens)
        max_chunk = max(max_chunk, workload.max_prompt_tokens)
        max_kv = max(max_kv, workload.max_total_tokens)
    context = model.max_position_embeddings
    if workload is not None and cfg.max_kv_cache_size <= context < workload.max_total_tokens:
        raise ConfigError(
            f"{workload.path or 'workload'} ({workload.workload_id}): its longest request has "
            f"{workload.max_total_tokens} tokens (prompt + output), beyond model {model.name}'s "
            f"context ({context} tokens): no engine of this model serves it"
        )
    if max_kv > context:
        raise ConfigError(
            f"profile.max_kv_cache_size={max_kv} is beyond model {model.name}'s context "
            f"({model.max_position_embeddings} tokens)"
        )
    return Ranges(
        max_num_tokens=max_tokens,
        max_batch_size=cfg.max_batch_size,
        max_prefill_chunk=max_chunk,
        max_kv_cache_size=max_kv,
        num_points=cfg.num_points
        or AUTO_NUM_POINTS["cuda" if device.startswith("cuda") else "cpu"],
    )


def axis(
    maximum: int,
    num_points: int,
    small: Iterable[int] = (),
    minimum: int = 1,
    geometric_from: int = 1,
) -> tuple[int, ...]:
    """Sorted distinct integers in [minimum, maximum]: ``small``, a geometric sweep of
    ``num_points`` from ``geometric_from``, a linear sweep of half as many, and the two ends."""
    if maximum < minimum:
        raise ValueError(f"axis maximum {maximum} is below its minimum {minimum}")
    values = {v for v in small if minimum <= v <= maximum}
    values |= {minimum, maximum}
    start = min(max(geometric_from, minimum, 1), maximum)
    geometric = np.geomspace(start, maximum, num=num_points)
    linear = np.linspace(minimum, maximum, num=max(2, num_points // 2))
    values |= {round(float(v)) for v in np.concatenate([geometric, linear])}
    return tuple(sorted(v for v in values if minimum <= v <= maximum))


def build_grid(ranges: Ranges) -> ProfileGrid:
    """The shapes to time for ``ranges`` (see the module docstring for why these)."""
    n = ranges.num_points
    return ProfileGrid(
        num_tokens=axis(ranges.max_num_tokens, n, SMALL_NUM_TOKENS),
        batch_sizes=axis(ranges.max_batch_size, max(2, n // 2), SMALL_BATCH_SIZES),
        prefill_chunks=axis(ranges.max_prefill_chunk, n, SMALL_PREFILL_CHUNKS, geometric_from=8),
        kv_cache_sizes=axis(
            ranges.max_kv_cache_size, n, SMALL_KV_CACHE_SIZES, minimum=0, geometric_from=16
        ),
    )
