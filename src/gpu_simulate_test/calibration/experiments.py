"""The engine calibration's experiments: which prefills, decode batches (at the workload's short,
middle and longest contexts), mixed steps, bursts of prompts and prefills over a cached prefix are
timed, and how often (:func:`plan_experiments`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu_simulate_test.config.backends import BackendConfig, VllmEngineBackendConfig
from gpu_simulate_test.config.vidur import EngineCalibrationConfig

SEQUENTIAL_BACKENDS: tuple[str, ...] = ("hf_generate",)
"""Backends that serve one request at a time: only batch 1 is calibrated."""
AUTO_PROMPT_POINTS = 4
MIN_DECODE_SAMPLES = 64
"""Decode gaps behind each decode row at least: a batch of 1 gave 24 gaps from 3 repeats, and
its median moved by 8% between two calibrations on a shared 2-core machine."""
DENSE_BATCH_SIZES = 16
"""Decode batches up to this size are all calibrated (beyond it, every 4th)."""
MIXED_DECODERS = 4
"""The larger decode batch a mixed experiment prefills next to (the other is 1)."""
BURST_PROMPTS: tuple[int, ...] = (2, 4, 8)
"""burst: prompts sent at once (each as many as fit one step's batch and token budget)."""
CONTEXT_BATCH_SIZES: tuple[int, ...] = (1, 4, 16)
"""Decode batches also timed at the middle and longest context (and the largest batch)."""
CACHED_FRACTIONS: tuple[int, ...] = (4, 2)
"""cached_prefill: the cached prefixes are these fractions (1/4, 1/2) of the longest prefill,
each rounded down to whole KV blocks."""


@dataclass(frozen=True)
class Experiment:
    phase: str
    """prefill, decode, mixed, burst or cached_prefill (a burst is planned and driven, never a
    row: its steps become prefill and mixed rows by what each step carried)."""
    batch_size: int
    """Decoding requests (decode, mixed, burst: 0 or more); prompts of a prefill (1 for an
    experiment, k for a row read off a burst); 1 for cached_prefill."""
    prompt_tokens: int
    """The prefilled request's prompt (prefill, mixed); the decoders' prompt (decode); the
    prompt's uncached part that the step prefills (cached_prefill)."""
    decode_prompt_tokens: int = 0
    """mixed: the decoders' prompt."""
    cached_tokens: int = 0
    """cached_prefill: the prompt's prefix already in the prefix cache (whole KV blocks, put there
    by a primer request just before), which the step attends to but does not compute."""
    num_prompts: int = 1
    """mixed and burst: prompts prefilled at once next to the decoders (a burst's newcomers)."""
    context_tokens: int = 0
    """A row read off a burst: its decoders' context (0: as the phase computes it)."""

    @property
    def num_requests(self) -> int:
        return self.batch_size + (self.num_prompts if self.phase in ("mixed", "burst") else 0)


def auto_prompt_lengths(max_tokens: int) -> tuple[int, ...]:
    """``AUTO_PROMPT_POINTS`` lengths from 16 up to ``max_tokens``, geometric."""
    top = max(16, max_tokens)
    points = np.geomspace(16, top, AUTO_PROMPT_POINTS)
    return tuple(sorted({int(np.rint(p)) for p in points}))


def auto_batch_sizes(cap: int) -> tuple[int, ...]:
    """Every size up to ``DENSE_BATCH_SIZES``, then every 4th, and ``cap`` itself.

    Step time is not smooth in the batch size: on 2 CPU cores hf_cb's tiny-model step took
    16, 30, 39, 27, 24, 32, 42, 27 ms at 1..8 requests (the LM head's matmul picks its kernel by
    row count), so interpolating between powers of two missed the slow sizes by up to 40%.
    """
    sizes = set(range(1, min(cap, DENSE_BATCH_SIZES) + 1))
    sizes.update(range(DENSE_BATCH_SIZES + 4, cap + 1, 4))
    sizes.add(cap)
    return tuple(sorted(sizes))


def cached_prefixes(backend: BackendConfig, limit: int) -> tuple[int, ...]:
    """cached_prefill's cached prefixes: :data:`CACHED_FRACTIONS` of ``limit`` rounded down to
    whole KV blocks (vLLM caches and hits whole blocks only), none under one block; none
    without vLLM's prefix caching."""
    if not isinstance(backend, VllmEngineBackendConfig) or not backend.enable_prefix_caching:
        return ()
    block = backend.block_size
    return tuple(sorted({limit // f // block * block for f in CACHED_FRACTIONS} - {0}))


def plan_experiments(cfg: EngineCalibrationConfig, max_prompt_tokens: int) -> list[Experiment]:
    """The prefill, decode and mixed experiments (and, with vLLM's prefix caching, the prefills
    over a cached prefix), each ``times(...)`` times, interleaved in rounds (every experiment
    once, then every one that still needs a run again, ...).

    Prompts stay within one engine step: at most ``backend.max_num_batched_tokens`` for an engine
    that chunks (``hf_cb``), and at most ``max_prompt_tokens`` (what the bundle covers); a cached
    prefill's whole prompt (cached prefix and the prefilled rest) too.
    """
    backend = cfg.backend
    sequential = backend.name in SEQUENTIAL_BACKENDS
    budget, batch_cap = backend.step_limits()
    limit = max_prompt_tokens if sequential else min(max_prompt_tokens, budget)
    prompts = cfg.prompt_lengths or auto_prompt_lengths(limit)
    too_long = [p for p in prompts if p > limit]
    if too_long:
        raise ValueError(
            f"engine.prompt_lengths {too_long} exceed {limit} tokens (one engine step of "
            f"{backend.name}: backend.max_num_batched_tokens, and the profiled prefill range)"
        )
    cap = 1 if sequential else batch_cap
    batches = cfg.batch_sizes or auto_batch_sizes(cap)
    too_big = [b for b in batches if b > cap]
    if too_big:
        raise ValueError(
            f"engine.batch_sizes {too_big} exceed what {backend.name} runs in one step ({cap})"
        )
    experiments = [Experiment("prefill", 1, p) for p in prompts]
    if not sequential:
        # right after the prefills: a cached prefill's primer runs before its experiment starts,
        # in the window of the experiment before, where only that experiment's first prompt step
        # is taken (a decode window would take the primer's decode steps)
        experiments += [
            Experiment("cached_prefill", 1, t, cached_tokens=c)
            for c in cached_prefixes(backend, limit)
            for t in sorted({prompts[0], prompts[-1]})
            if c + t <= max_prompt_tokens
        ]
    experiments += [Experiment("decode", b, cfg.decode_prompt_tokens) for b in batches]
    experiments += [
        Experiment("decode", b, c)
        for c in decode_contexts(cfg.decode_prompt_tokens, max_prompt_tokens, cfg.decode_tokens)
        for b in sorted({*(s for s in CONTEXT_BATCH_SIZES if s in batches), max(batches)})
        if kv_holds(backend, c + cfg.decode_tokens, b)
    ]
    if cfg.mixed and not sequential:
        mixed_sizes = sorted({1, max(1, min(MIXED_DECODERS, cap - 1))})
        experiments += [
            Experiment("mixed", b, p, cfg.decode_prompt_tokens)
            for b in mixed_sizes
            for p in sorted({prompts[0], prompts[-1]})
            if b + 1 <= cap
        ]
    if cfg.bursts and not sequential:
        experiments += [
            Experiment("burst", d, p, cfg.decode_prompt_tokens, num_prompts=k)
            for d in sorted({0, max(0, min(MIXED_DECODERS, cap - 2))})
            for p in burst_prompts(prompts, budget - d)
            for k in BURST_PROMPTS
            if d + k <= cap and k * p + d <= budget
        ]
    # interleaved: round r runs every experiment that still needs a run, so each row's samples
    # spread over the whole calibration instead of one burst of a few seconds
    counts = {e: times(e, cfg) for e in experiments}
    return [e for r in range(max(counts.values())) for e in experiments if r < counts[e]]


def burst_prompts(prompts: tuple[int, ...], budget: int) -> tuple[int, ...]:
    """A burst's prompt lengths: the shortest, and the longest of which two fit one step's
    ``budget`` of tokens (the longest prompt often fills a step alone)."""
    pairs = [p for p in prompts if 2 * p <= budget]
    return tuple(sorted({prompts[0], *pairs[-1:]}))


def decode_contexts(short: int, longest_prompt: int, decode_tokens: int) -> tuple[int, ...]:
    """The decoders' prompts of the decode experiments beyond ``short`` (the decode rows'
    usual one): the middle and the longest the profile covers (``longest_prompt`` less the
    outputs, so that the last decode's context stays within it), each past the one before."""
    longest = max(short, longest_prompt - decode_tokens)
    middle = (short + longest) // 2
    return tuple(c for c in sorted({middle, longest}) if c > short + decode_tokens)


def kv_holds(backend: BackendConfig, tokens: int, batch: int) -> bool:
    """Whether the engine's KV blocks hold ``batch`` requests of ``tokens`` tokens each (no bound
    where the backend names no blocks)."""
    blocks = getattr(backend, "num_gpu_blocks_override", 0) or 0
    size = getattr(backend, "block_size", 0) or 0
    return not (blocks and size) or tokens * batch <= blocks * size


def times(exp: Experiment, cfg: EngineCalibrationConfig) -> int:
    """How often an experiment runs: ``cfg.repeats``, and for small decode batches as often as
    it takes to time ``MIN_DECODE_SAMPLES`` steps (one request gives decode_tokens / 2 gaps)."""
    if exp.phase != "decode":
        return cfg.repeats
    per_run = exp.batch_size * max(1, cfg.decode_tokens // 2)
    return max(cfg.repeats, -(-MIN_DECODE_SAMPLES // per_run))
