"""What our event loop needs from Vidur: the replica scheduler's settings, whether a config is
one it reproduces, and each batch's time from Vidur's predictor (:mod:`.event_loop`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from gpu_simulate_test.calibration.overhead import step_s

SCHEDULERS: tuple[str, ...] = ("sarathi", "vllm", "orca")


class NeedsVidurLoop(Exception):
    """The simulation reached a state this loop does not reproduce."""


class KvCacheExhausted(NeedsVidurLoop):
    """A decode batch could find no free KV block: Vidur would preempt and restart requests."""

    def __init__(self, t: float, running: int, due: int, free: int, num_blocks: int) -> None:
        super().__init__(
            f"at t={t:.6g} s, {running} running requests need {due} more KV blocks and "
            f"{free} of {num_blocks} are free"
        )


@dataclass(frozen=True)
class LoopParams:
    """The replica scheduler's settings, as Vidur's scheduler object computed them."""

    scheduler: str
    """``sarathi``, ``vllm`` or ``orca``."""
    num_blocks: int
    block_size: int
    watermark_blocks: int
    batch_size_cap: int
    max_micro_batch_size: int
    """sarathi and vllm: ``batch_size_cap // stages``; orca: Vidur's ``_max_batch_size``."""
    chunk_size: int = 0
    max_tokens_in_batch: int = 0
    max_blocks_per_sequence: int = 0


def params_from_scheduler(replica_scheduler: Any) -> LoopParams:
    """Read the settings off Vidur's replica scheduler object (sarathi, vllm, fixed orca)."""
    from vidur.scheduler.replica_scheduler.sarathi_replica_scheduler import (
        SarathiReplicaScheduler,
    )
    from vidur.scheduler.replica_scheduler.vllm_replica_scheduler import VLLMReplicaScheduler

    from gpu_simulate_test.vidur_simulate.schedulers import OrcaFixedReplicaScheduler

    config, cache = replica_scheduler._config, replica_scheduler._cache_config
    common = {
        "num_blocks": int(cache.num_blocks),
        "block_size": int(cache.block_size),
        "batch_size_cap": int(config.batch_size_cap),
        "max_blocks_per_sequence": int(replica_scheduler._max_blocks_per_sequence),
    }
    if type(replica_scheduler) is SarathiReplicaScheduler:
        return LoopParams(
            scheduler="sarathi",
            watermark_blocks=int(replica_scheduler._watermark_blocks),
            max_micro_batch_size=int(replica_scheduler._max_micro_batch_size),
            chunk_size=int(config.chunk_size),
            **common,
        )
    if type(replica_scheduler) is VLLMReplicaScheduler:
        return LoopParams(
            scheduler="vllm",
            watermark_blocks=int(replica_scheduler._watermark_blocks),
            max_micro_batch_size=int(replica_scheduler._max_micro_batch_size),
            max_tokens_in_batch=int(config.max_tokens_in_batch),
            **common,
        )
    if type(replica_scheduler) is OrcaFixedReplicaScheduler:
        return LoopParams(
            scheduler="orca",
            watermark_blocks=0,
            max_micro_batch_size=int(replica_scheduler._max_batch_size),
            **common,
        )
    raise ValueError(f"no fast event loop for {type(replica_scheduler).__name__}")


def unsupported_reason(simulation_config: Any) -> str | None:
    """Why this Vidur config needs Vidur's own loop (None: the fast loop reproduces it)."""
    from vidur.types import GlobalSchedulerType

    cluster = simulation_config.cluster_config
    replica = cluster.replica_config
    if cluster.num_replicas != 1:
        return f"{cluster.num_replicas} replicas"
    if replica.num_pipeline_stages != 1:
        return f"{replica.num_pipeline_stages} pipeline stages"
    if replica.enable_sequence_pipeline_parallel:
        return "sequence pipeline parallelism"
    if simulation_config.metrics_config.enable_chrome_trace:
        return "a chrome trace (Vidur's events)"
    if simulation_config.time_limit:
        return "a time limit"
    if cluster.global_scheduler_config.get_type() != GlobalSchedulerType.ROUND_ROBIN:
        return f"global scheduler {cluster.global_scheduler_config.get_type()}"
    return None


class BatchTimer:
    """A batch's execution time from Vidur's predictor, memoized on what the predictor reads."""

    def __init__(self, predictor: Any) -> None:
        from gpu_simulate_test.vidur_simulate.predictor import LocalRFExecutionTimePredictor

        if not isinstance(predictor, LocalRFExecutionTimePredictor):
            raise TypeError(f"no fast event loop for predictor {type(predictor).__name__}")
        self._base = super(LocalRFExecutionTimePredictor, predictor).get_execution_time
        self.granularity = int(predictor._config.kv_cache_prediction_granularity)
        self.overhead = predictor.step_overhead
        self.jitter: Callable[[], float] | None = (
            predictor.step_jitter if self.overhead is not None else None
        )
        # vidur.step_time_scale (Vidur's schedulers; vLLM's V1 applies it per step): in the
        # jitter factor where there is one, as the predictor multiplies it, else in the time
        scale = float(predictor.step_scale)
        self._scale = scale if self.jitter is None else 1.0
        if self.jitter is not None and scale != 1.0:
            draw = self.jitter
            self.jitter = lambda: draw() * scale
        self._memo: dict[tuple[Any, ...], float] = {}

    def time(
        self, total_q: int, num_decodes: int, decode_kv: int, prefills: tuple[tuple[int, int], ...]
    ) -> float:
        """Seconds for a batch of ``total_q`` query tokens: ``num_decodes`` one-token entries
        whose mean KV size, rounded up to the granularity, is ``decode_kv``, and ``prefills``
        as (KV size rounded up, query tokens) in batch order. Before the jitter factor (which
        carries ``vidur.step_time_scale`` where there is one)."""
        key = (total_q, num_decodes, decode_kv, prefills)
        value = self._memo.get(key)
        if value is None:
            q = [1] * num_decodes + [chunk for _, chunk in prefills]
            kv = [decode_kv] * num_decodes + [size for size, _ in prefills]
            shape = SimpleNamespace(
                num_q_tokens=q,
                num_kv_tokens=kv,
                _total_num_q_tokens=total_q,
                _total_num_q_tokens_rounded=(total_q + 7) // 8 * 8,
                # what the predictor would derive from the lists above (it reads these first)
                _decode_params=(num_decodes, decode_kv),  # (0, 0) without decodes
                _prefill_params=list(prefills),
            )
            value = float(self._base(shape, 0).total_time)
            if self.overhead is not None:  # ExecutionTimeWithOverhead.total_time, less the factor
                value = step_s(value, self.overhead.scale_for(q), self.overhead.ms(q))
            self._memo[key] = value
        return value * self._scale
