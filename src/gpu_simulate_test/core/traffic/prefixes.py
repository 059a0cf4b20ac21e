"""Shared prefixes of a synthetic workload (``workload.prefix``), in the style of ``vllm bench
serve --dataset-name prefix_repetition``: K prefixes, each request starting with one of them and
followed by its own tokens.

Every draw here comes from its own seed stream (``SeedSequence([seed, 2])``), split from the ones
the lengths, arrivals and prompt tokens use, so turning prefixes on leaves those draws as they were
and a workload without prefixes is byte-identical to one built before prefixes existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from gpu_simulate_test.config.schema import PrefixConfig
from gpu_simulate_test.core.traffic.prompts import exact_text_prompts, random_token_ids
from gpu_simulate_test.core.traffic.sampling import sample_lengths

PREFIX_STREAM = 2
"""The seed stream of the prefixes: ``SeedSequence([workload.seed, PREFIX_STREAM])`` (stream 1 is
the prompt tokens')."""


@dataclass(frozen=True)
class SharedPrefixes:
    """The prefixes' lengths and which prefix each request (in arrival order) starts with."""

    prefix_lengths: np.ndarray
    """Tokens of each prefix, indexed by prefix id (int64)."""
    prefix_id: np.ndarray
    """Per request, the id (0-based) of the prefix its prompt starts with (int64)."""
    seed: int
    """The workload seed: the prefixes' tokens are drawn from its prefix stream."""

    @property
    def num_prefixes(self) -> int:
        return len(self.prefix_lengths)

    @property
    def request_prefix_len(self) -> np.ndarray:
        """Per request, the tokens of its prefix."""
        return self.prefix_lengths[self.prefix_id]

    def requests_per_prefix(self) -> list[int]:
        return [int(c) for c in np.bincount(self.prefix_id, minlength=self.num_prefixes)]

    def _token_rng(self) -> np.random.Generator:
        return np.random.default_rng(_streams(self.seed)[2])

    def token_ids(self, vocab_size: int) -> list[np.ndarray]:
        """Each prefix's random token ids (the same ids for every request sharing it)."""
        return random_token_ids(self.prefix_lengths, vocab_size, self._token_rng())

    def texts(self, tokenizer: Any) -> list[str]:
        """Each prefix's text, of exactly its length in tokens (one-token words)."""
        return exact_text_prompts(self.prefix_lengths.tolist(), tokenizer, self._token_rng())


def _streams(seed: int) -> list[np.random.SeedSequence]:
    """Three independent streams: prefix lengths, the share, the prefixes' tokens."""
    return np.random.SeedSequence([seed, PREFIX_STREAM]).spawn(3)


def draw_prefixes(cfg: PrefixConfig, seed: int, num_requests: int) -> SharedPrefixes | None:
    """Draw the prefixes' lengths and each request's prefix; None when prefixes are off."""
    if cfg.num_prefixes == 0:
        return None
    lengths_seq, share_seq, _tokens = _streams(seed)
    lengths = sample_lengths(cfg.len, cfg.num_prefixes, np.random.default_rng(lengths_seq))
    share_rng = np.random.default_rng(share_seq)
    if cfg.share == "zipf":
        weights = 1.0 / np.arange(1, cfg.num_prefixes + 1, dtype=float) ** cfg.zipf_a
        prefix_id = share_rng.choice(cfg.num_prefixes, size=num_requests, p=weights / weights.sum())
    else:
        prefix_id = share_rng.integers(0, cfg.num_prefixes, size=num_requests)
    return SharedPrefixes(lengths, np.asarray(prefix_id, dtype=np.int64), seed)


def describe(prefixes: SharedPrefixes, cfg: PrefixConfig) -> dict[str, Any]:
    """The ``prefix`` entry of ``workload_meta.json``: the settings and what was drawn."""
    return {
        "num_prefixes": prefixes.num_prefixes,
        "share": cfg.share,
        "zipf_a": cfg.zipf_a,
        "prefix_len_tokens": [int(n) for n in prefixes.prefix_lengths],
        "requests_per_prefix": prefixes.requests_per_prefix(),
    }
