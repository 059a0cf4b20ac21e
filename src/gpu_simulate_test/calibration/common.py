"""Helpers the engine calibration's drive and readings share: random prompts, waiting on the
engine, and each experiment's window of logged steps. A leaf: it imports nothing else of
:mod:`gpu_simulate_test.calibration`, so every module of the package may import it."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import pandas as pd

from gpu_simulate_test.core.engines import BackendError
from gpu_simulate_test.core.engines.records import Recorder
from gpu_simulate_test.core.profiling.bundle import IDLE_PREFILL_PHASES

POLL_S = 0.01
"""How long a wait for the engine sleeps between looks (when no request changed)."""
MIXED_START_FRACTION = 3
"""mixed: the newcomer arrives once the decoders have a third of their outputs."""


class Composition(Protocol):
    """What :func:`windows` reads of an experiment
    (:class:`~gpu_simulate_test.calibration.experiments.Experiment`)."""

    @property
    def phase(self) -> str: ...

    @property
    def batch_size(self) -> int: ...

    @property
    def prompt_tokens(self) -> int: ...


ExperimentT = TypeVar("ExperimentT", bound=Composition)


def random_prompt(rng: np.random.Generator, vocab_size: int, length: int) -> tuple[int, ...]:
    """``length`` random token ids (below 32,000 and the vocabulary)."""
    return tuple(int(t) for t in rng.integers(0, min(vocab_size, 32_000), length))


def wait(
    backend: Any,
    recorder: Recorder,
    ids: Sequence[int],
    timeout_s: float,
    min_tokens: int | None = None,
    during: str = "engine calibration",
    what: str = "engine calibration step",
) -> None:
    """Until every request in ``ids`` is done (or, with ``min_tokens``, has that many tokens);
    BackendError naming ``during`` when the engine dies, ``what`` when it runs out of time."""

    def ready(i: int) -> bool:
        rec = recorder.records[i]
        if min_tokens is None:
            return rec.is_done
        return rec.is_done or len(rec.event_times_s) >= min_tokens

    deadline = time.perf_counter() + timeout_s
    while not all(ready(i) for i in ids):
        if (why := backend.failure()) is not None:
            raise BackendError(f"{backend.name} died during {during}: {why}")
        if time.perf_counter() > deadline:
            raise BackendError(f"{what} not done within {timeout_s:g} s")
        recorder.wait_for_change(POLL_S)


def windows(
    experiments: Sequence[ExperimentT], starts: Sequence[float], steps: pd.DataFrame
) -> Iterator[tuple[int, ExperimentT, np.ndarray]]:
    """``(i, experiment, rows)`` for every experiment run: the positions in ``steps`` of the
    steps of exactly its composition, logged in its window (its start to the next one's).

    decode: the steps that decoded exactly the batch and nothing else; prefill: the prompt on its
    own; cached_prefill: the prompt's uncached part on its own (its primer ran before its start);
    mixed: the prompt next to the decoders; burst: two or more of its prompts, whole, next to
    whatever else ran."""
    times = steps["time_s"].to_numpy(dtype=float)
    prompt = steps["num_prefill_tokens"].to_numpy()
    decoding = steps["num_decode_requests"].to_numpy()
    bounds = [*starts[1:], float("inf")]
    for i, (exp, lo, hi) in enumerate(zip(experiments, starts, bounds, strict=True)):
        inside = (times >= lo) & (times < hi)
        if exp.phase == "decode":
            chosen = (prompt == 0) & (decoding == exp.batch_size)
        elif exp.phase == "burst":  # two or more of its prompts, whole, next to anything
            prompts = steps["num_prefill_requests"].to_numpy()
            chosen = (prompts >= 2) & (prompt == prompts * exp.prompt_tokens)
        elif exp.phase in IDLE_PREFILL_PHASES:
            chosen = (prompt == exp.prompt_tokens) & (decoding == 0)
        else:
            chosen = (prompt == exp.prompt_tokens) & (decoding == exp.batch_size)
        yield i, exp, np.flatnonzero(inside & chosen)
