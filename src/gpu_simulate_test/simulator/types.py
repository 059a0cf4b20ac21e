"""The types vLLM's V1 scheduler in our loop speaks (:mod:`.vllm_v1`): its knobs, a step's
composition and the clock that times steps."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

NAME = "vllm_v1"
ENGINE_QUEUED = "engine_queued_time"
"""Beside Vidur's columns: when the engine core took the request into its queue. vLLM's core
reads new requests only between steps, so one that arrives while a step runs is queued when it
ends (its engine clock starts there, as the real engine stamps it)."""
ARRIVED = "arrived_at"
"""Beside Vidur's columns, with a closed loop: when each request reached the engine (a later
turn's, the simulated send)."""
ENGINE = "engine"
"""The column of a fleet's tables naming the engine (0 to N-1) a request or a step ran on."""
CACHED_TOKENS = "cached_tokens"
"""Beside Vidur's columns, with prefix caching: the prompt tokens served from the cache at the
request's first admission (vLLM's ``num_cached_tokens``, the usage's
``prompt_tokens_details.cached_tokens``)."""


def is_count(value: object) -> bool:
    """Whether ``value`` is a whole number as Python or numpy holds one (not a bool)."""
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


@dataclass(frozen=True)
class V1Params:
    """The knobs vLLM's scheduler reads (the ``vllm`` backend's, one for one)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_blocks: int
    """``--num-gpu-blocks-override``: vLLM keeps one of them as its null block."""
    long_prefill_token_threshold: int = 0
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = False

    def __post_init__(self) -> None:
        for name, least in (
            ("max_num_batched_tokens", 1),
            ("max_num_seqs", 1),
            ("block_size", 1),
            ("num_blocks", 1),
            ("long_prefill_token_threshold", 0),
        ):
            value = getattr(self, name)
            if not is_count(value) or value < least:
                none = " (0: none)" if least == 0 else ""
                raise ValueError(
                    f"V1Params.{name} is {value!r}, expected a whole number >= {least}{none}"
                )
        for name in ("enable_chunked_prefill", "enable_prefix_caching"):
            value = getattr(self, name)
            if not isinstance(value, bool | np.bool_):  # "no" is truthy: it would turn it on
                raise ValueError(f"V1Params.{name} is {value!r}, expected True or False")
        if self.max_num_batched_tokens < self.max_num_seqs:  # vLLM's SchedulerConfig refuses it
            raise ValueError(
                f"V1Params.max_num_batched_tokens ({self.max_num_batched_tokens}) is below "
                f"max_num_seqs ({self.max_num_seqs}): vLLM expects a budget of at least one "
                "token per request"
            )
        if self.num_blocks < 2:
            raise ValueError(
                f"V1Params.num_blocks is {self.num_blocks}, expected >= 2 (vLLM keeps one as its "
                "null block, none would be left for requests)"
            )

    @property
    def usable_blocks(self) -> int:
        return self.num_blocks - 1


class Composition:
    """One step as vLLM's log counts it, and the batch shape Vidur's predictor reads (a plain
    slotted class, read-only by convention: one is made per simulated step)."""

    __slots__ = (
        "chunks", "decode_requests", "decode_tokens", "first_scheduled", "idle_s",
        "prefill_requests", "prefill_tokens", "start_s",
    )  # fmt: skip

    def __init__(
        self,
        prefill_requests: int,
        prefill_tokens: int,
        decode_requests: int,
        decode_tokens: int,
        chunks: tuple[tuple[int, int], ...],
        start_s: float = 0.0,
        idle_s: float = 0.0,
        first_scheduled: int = 0,
    ) -> None:
        self.prefill_requests = prefill_requests
        self.prefill_tokens = prefill_tokens
        self.decode_requests = decode_requests
        self.decode_tokens = decode_tokens
        self.chunks = chunks
        """(query tokens, KV tokens after the step) per scheduled request, in batch order."""
        self.start_s = start_s
        """When it was scheduled (the simulation's clock)."""
        self.idle_s = idle_s
        """How long the engine had been idle before it (0: busy)."""
        self.first_scheduled = first_scheduled
        """Requests scheduled for the first time (not resumed after preemption)."""

    @property
    def key(self) -> tuple[int, int, int, int]:
        return (
            self.prefill_requests,
            self.prefill_tokens,
            self.decode_requests,
            self.decode_tokens,
        )

    def __repr__(self) -> str:
        return (
            f"Composition(key={self.key}, chunks={self.chunks}, start_s={self.start_s}, "
            f"idle_s={self.idle_s}, first_scheduled={self.first_scheduled})"
        )


class StepClock(Protocol):
    """When steps happen: per step ``index`` (from 0) and its composition."""

    def gap(self, index: int) -> float:
        """Seconds from the previous step's outputs to this step's scheduling, with work (a
        clock may also have ``intake_gap(index)``: the same before a busy step that takes a
        request in, :meth:`~.step_model.PredictorClock.intake_gap`)."""

    def lead(self, index: int) -> float:
        """Seconds from the arrival that woke an idle engine to this step's scheduling."""

    def body(self, index: int, step: Composition) -> float:
        """Seconds from scheduling to outputs."""


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


Chosen = list[tuple[int, int, bool]]
"""A step's requests in batch order: (request, new tokens, whether vLLM counts it as context)."""
