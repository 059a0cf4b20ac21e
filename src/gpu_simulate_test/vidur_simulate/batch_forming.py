"""How each of Vidur's replica schedulers forms the next batch, one class per scheduler.

As in Vidur (``vidur/scheduler/replica_scheduler/``: a base class with ``allocate``, ``free``
and ``can_allocate`` under one ``_get_next_batch`` per scheduler), :class:`KvBlocks` keeps the
KV-block accounting every scheduler shares and each subclass forms a batch its way:

- :class:`SarathiBatches`: every decode, then the running prefills' chunks in Sarathi's order,
  then new requests while the chunk budget, the cap and the blocks (above the watermark) last;
- :class:`VllmBatches` (Vidur's ``vllm``, not vLLM's V1: see :mod:`.vllm_v1`): whole prompts while
  the token budget, the cap and the blocks last, and the decodes only in a batch without prompts;
- :class:`OrcaBatches` (the fixed Orca, :mod:`.schedulers`): every decode, then whole prompts
  each holding a whole sequence's blocks, up to the batch size.

:class:`.aggregate_engine.AggregateEngine` owns the clock, the batch ends and the bulk decode
runs (:mod:`.decode_runs`); it asks the scheduler's object for each batch. Requests are their
arrival ranks; the queue is ranks ``head..tail-1``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import ClassVar

from gpu_simulate_test.vidur_simulate.loop_setup import KvCacheExhausted, LoopParams

Formed = tuple[list[tuple[int, int]], int, int, list[int], int]
"""A formed batch: (rank, query tokens) entries, decodes, total query tokens, the running prefills
that got no chunk (Sarathi's order for the next batch) and the queue's new head."""


class KvBlocks:
    """Vidur's block accounting: blocks held per request and in all, and by how many requests."""

    tracks_decode_blocks: ClassVar[bool] = True
    """Whether a decode takes a new block each ``block_size`` tokens (Orca reserves a whole
    sequence's blocks at admission instead)."""

    def __init__(self, params: LoopParams, pre: list[int], arr: list[float]) -> None:
        self.params = params
        self.pre = pre
        self.arr = arr
        self.num_blocks = params.num_blocks
        self.allocated = 0
        self.holders = 0  # Vidur's len(_allocation_map)
        self.blocks = [0] * len(pre)  # per request, after its last allocation
        self.due: dict[int, int] = {}
        """Blocks the decodes take at the start of decode batch index ``k``."""

    def can_allocate(self, need: int) -> bool:
        return self.num_blocks - self.allocated - need >= self.params.watermark_blocks

    def allocate(self, r: int, need: int) -> None:
        self.allocated += need
        self.blocks[r] = need
        self.holders += 1

    def free(self, r: int) -> None:
        self.allocated -= self.blocks[r]
        self.holders -= 1

    def grow_decodes(self, index: int, t: float, running: int) -> None:
        """The blocks decode batch ``index`` takes; KvCacheExhausted when they are not there."""
        due = self.due.pop(index, 0)
        if self.num_blocks - self.allocated - due < 1:
            free = self.num_blocks - self.allocated
            raise KvCacheExhausted(t, running, due, free, self.num_blocks)
        self.allocated += due

    def form(
        self,
        head: int,
        tail: int,
        num_dec: int,
        next_dec: int,
        prefilling: list[int],
        proc: list[int],
        t: float,
    ) -> Formed:
        """The next batch at time ``t``, admitting from the queue ``head..tail-1``."""
        raise NotImplementedError


class SarathiBatches(KvBlocks):
    def form(
        self,
        head: int,
        tail: int,
        num_dec: int,
        next_dec: int,
        prefilling: list[int],
        proc: list[int],
        t: float,
    ) -> Formed:
        p = self.params
        pre = self.pre
        chunk, cap, micro, bs = p.chunk_size, p.batch_size_cap, p.max_micro_batch_size, p.block_size
        batch_decodes = num_dec
        if batch_decodes:
            self.grow_decodes(next_dec, t, num_dec)
        total_q = batch_decodes
        entries: list[tuple[int, int]] = []
        skipped: list[int] = []
        for r in prefilling:
            q = pre[r] - proc[r]
            if q > chunk - total_q:
                q = chunk - total_q
            if q <= 0:
                skipped.append(r)
                continue
            total_q += q
            entries.append((r, q))
        # a prefill that got no chunk moves ahead of those that did
        skipped_sorted = sorted(skipped, key=self.arr.__getitem__) if len(skipped) > 1 else skipped
        while head < tail:
            if self.holders == cap or batch_decodes + len(entries) == micro:
                break
            need = -(-pre[head] // bs)
            if not self.can_allocate(need):
                break
            q = pre[head]
            if q > chunk - total_q:
                q = chunk - total_q
            if q <= 0:
                break
            self.allocate(head, need)
            total_q += q
            entries.append((head, q))
            head += 1
        return entries, batch_decodes, total_q, skipped_sorted, head


class VllmBatches(KvBlocks):
    def form(
        self,
        head: int,
        tail: int,
        num_dec: int,
        next_dec: int,
        prefilling: list[int],
        proc: list[int],
        t: float,
    ) -> Formed:
        p = self.params
        pre = self.pre
        cap, micro, bs = p.batch_size_cap, p.max_micro_batch_size, p.block_size
        entries: list[tuple[int, int]] = []
        total_q = 0
        while head < tail:
            q = pre[head]
            need = -(-q // bs)
            if not self.can_allocate(need):
                break
            if total_q + q > p.max_tokens_in_batch or self.holders == cap or len(entries) == micro:
                break
            self.allocate(head, need)
            entries.append((head, q))
            total_q += q
            head += 1
        batch_decodes = num_dec if not entries else 0
        if batch_decodes:
            self.grow_decodes(next_dec, t, num_dec)
        return entries, batch_decodes, total_q + batch_decodes, [], head


class OrcaBatches(KvBlocks):
    tracks_decode_blocks = False

    def form(
        self,
        head: int,
        tail: int,
        num_dec: int,
        next_dec: int,
        prefilling: list[int],
        proc: list[int],
        t: float,
    ) -> Formed:
        p = self.params
        pre = self.pre
        per_sequence, micro = p.max_blocks_per_sequence, p.max_micro_batch_size
        batch_decodes = num_dec
        total_q = batch_decodes
        entries: list[tuple[int, int]] = []
        while head < tail and batch_decodes + len(entries) < micro:
            if not self.can_allocate(per_sequence):  # Orca keeps no watermark (0)
                break
            self.allocate(head, per_sequence)
            q = pre[head]
            total_q += q
            entries.append((head, q))
            head += 1
        return entries, batch_decodes, total_q, [], head


FORMERS: Mapping[str, type[KvBlocks]] = MappingProxyType(
    {
        "sarathi": SarathiBatches,
        "vllm": VllmBatches,
        "orca": OrcaBatches,
    }
)
"""The batch-forming class of each scheduler our loop reproduces."""
