"""What our event loop needs from Vidur: the replica scheduler's settings, whether a config is
one it reproduces, and each batch's time from Vidur's predictor (:mod:`.event_loop`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpu_simulate_test.calibration.overhead import StepOverhead
from gpu_simulate_test.simulator.step_model import BatchTimer

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


def batch_timer(
    predictor: Any, overhead: StepOverhead | None, jitter: Any = None, scale: float = 1.0
) -> BatchTimer:
    """Our :class:`~..simulator.step_model.BatchTimer` over Vidur's predictor (its profiled ops
    alone: the predictor is read, never changed) and the engine's fitted ``overhead``."""
    from gpu_simulate_test.vidur_simulate.predictor import LocalRFExecutionTimePredictor

    if not isinstance(predictor, LocalRFExecutionTimePredictor):
        raise TypeError(f"no fast event loop for predictor {type(predictor).__name__}")
    base = super(LocalRFExecutionTimePredictor, predictor).get_execution_time
    granularity = int(predictor._config.kv_cache_prediction_granularity)
    return BatchTimer(base, granularity, overhead, jitter, scale)
