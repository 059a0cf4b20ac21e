"""The engines a simulation can run, by scheduler name (:data:`ENGINES`).

A new scheduler is one module with a runner of :data:`EngineRunner`'s signature (requests in as
arrays, :class:`~.run.V1Result` out) and one line in :data:`ENGINES`; a caller with its own adds
it to a copy (:meth:`EngineRegistry.with_engine`) and hands that to
:func:`~.api.simulate`. ``vllm_v1`` is vLLM 0.32's V1 scheduler (:mod:`.engine`). Vidur's own
schedulers (``sarathi``, ``vllm``, ``orca``) run in the ``vidur_simulate`` stage's loops, over
Vidur's configs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from gpu_simulate_test.simulator.run import V1Result, run_v1
from gpu_simulate_test.simulator.types import NAME

EngineRunner = Callable[..., V1Result]
"""``(params, clock, arrived_at, prefill_tokens, decode_tokens, *, segments, after,
log_steps)``."""


@dataclass(frozen=True)
class EngineRegistry:
    """Engines by name (read-only: a new one makes a new registry)."""

    runners: Mapping[str, EngineRunner]

    def with_engine(self, name: str, runner: EngineRunner) -> EngineRegistry:
        """This registry and ``name`` (replacing one of that name)."""
        return EngineRegistry(MappingProxyType({**self.runners, name: runner}))

    def get(self, name: str) -> EngineRunner:
        try:
            return self.runners[name]
        except KeyError:
            known = ", ".join(sorted(self.runners))
            raise ValueError(f"no engine named {name!r}: the registered ones are {known}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self.runners))


ENGINES = EngineRegistry(MappingProxyType({NAME: run_v1}))
"""The project's engines."""
