"""Replica-scheduler configs from our knobs, and a fixed copy of Vidur 0.0.26's Orca scheduler.

Vidur 0.0.26 ``OrcaReplicaScheduler._get_next_batch`` never appends ``num_kv_tokens`` for newly
admitted requests, so a batch has fewer KV sizes than requests and the predictor's ``zip()``
silently drops them: prefill attention of every new request costs 0. ``name=orca`` here runs
:class:`OrcaFixedReplicaScheduler`, registered under ``orca_fixed``; Vidur's entry is untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vidur.config import OrcaSchedulerConfig, SarathiSchedulerConfig, VllmSchedulerConfig
from vidur.entities import Batch
from vidur.scheduler.replica_scheduler.orca_replica_scheduler import OrcaReplicaScheduler
from vidur.scheduler.replica_scheduler.replica_scheduler_registry import ReplicaSchedulerRegistry

from gpu_simulate_test.config.vidur import VidurSchedulerConfig

ORCA_FIXED_TYPE = "orca_fixed"


@dataclass
class OrcaFixedSchedulerConfig(OrcaSchedulerConfig):
    """Orca, scheduled by :class:`OrcaFixedReplicaScheduler`."""

    @staticmethod
    def get_type() -> str:
        return ORCA_FIXED_TYPE


class OrcaFixedReplicaScheduler(OrcaReplicaScheduler):
    """Vidur's Orca with the missing ``num_kv_tokens`` of newly admitted requests restored."""

    def _get_next_batch(self, time: float) -> Batch | None:
        requests: list[Any] = []
        num_q_tokens: list[int] = []
        num_kv_tokens: list[int] = []
        # running requests (all past their prefill) first, then new ones while blocks last
        while self._preempted_requests and len(requests) < self._max_batch_size:
            request = self._preempted_requests.pop(0)
            self._add(request, requests, num_q_tokens, num_kv_tokens)
        while self._request_queue and len(requests) < self._max_batch_size:
            if not self.can_allocate(self._max_blocks_per_sequence):
                break
            request = self._request_queue.pop(0)
            self.allocate(request.id, self._max_blocks_per_sequence)
            self._add(request, requests, num_q_tokens, num_kv_tokens)
        if not requests:
            return None
        return Batch(self._replica_id, requests, num_q_tokens, num_kv_tokens)

    def _add(
        self, request: Any, requests: list[Any], num_q_tokens: list[int], num_kv_tokens: list[int]
    ) -> None:
        q_tokens = self._get_request_next_num_q_tokens(request)
        requests.append(request)
        num_q_tokens.append(q_tokens)
        num_kv_tokens.append(request.num_processed_tokens + q_tokens)


def register_schedulers() -> None:
    """Register the fixed Orca with Vidur (idempotent: Vidur ignores a repeated key)."""
    ReplicaSchedulerRegistry.register(ORCA_FIXED_TYPE, OrcaFixedReplicaScheduler)


def vidur_scheduler_config(knobs: VidurSchedulerConfig) -> Any:
    """Vidur's replica-scheduler config for our knobs (a fresh object: Vidur mutates configs)."""
    if knobs.name in ("sarathi", "vllm_v1"):  # vllm_v1: only Vidur's predictor is built
        return SarathiSchedulerConfig(
            batch_size_cap=knobs.batch_size_cap, chunk_size=knobs.chunk_size
        )
    if knobs.name == "vllm":
        return VllmSchedulerConfig(
            batch_size_cap=knobs.batch_size_cap, max_tokens_in_batch=knobs.max_tokens_in_batch
        )
    if knobs.name == "orca":
        return OrcaFixedSchedulerConfig(batch_size_cap=knobs.batch_size_cap)
    raise ValueError(f"unknown scheduler {knobs.name!r}")  # VidurSchedulerConfig rejects it first
