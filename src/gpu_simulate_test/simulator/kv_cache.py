"""How vLLM's V1 engine finds, allocates, caches and frees KV blocks, behind one seam
(:class:`KVCacheManager`): the scheduler (:mod:`.engine`) decides who runs, the cache what a
request gets, as vLLM keeps ``Scheduler`` apart from ``KVCacheManager`` over ``BlockPool``.

Two implementations of the one seam:

- :class:`CountingKVCache`, prefix caching off: blocks counted, not named;
- :class:`PrefixKVCache`, vLLM 0.32's automatic prefix caching for one full-attention group
  (``vllm/v1/core/kv_cache_manager.py``, ``block_pool.py``, ``kv_cache_utils.py``;
  ``specs/prefix_caching.md`` section 1), block for block:

  - a request's **full** blocks (prompt and output tokens) are keyed by their whole prefix (vLLM
    chains block hashes; we intern the prefix, so equal keys mean equal tokens, with no
    collision);
  - a new or preempted request hits the longest run of cached blocks from its start, at most
    ``(num_tokens - 1) // block_size`` of them (the last token is always recomputed);
  - blocks are cached when they are *scheduled* (``allocate_slots`` -> ``cache_blocks``), so a
    request admitted later in the same step already hits them; a key may map to several blocks,
    the first inserted serving hits;
  - freeing a request walks its blocks tail first: those that reach no reference and carry a
    key go to the tail of the free queue (evicted least recently freed first), the others to its
    head (reused first); a block taken from the free queue loses its key (eviction);
  - admission asks that the whole sequence fit: the blocks it lacks beyond its hit, plus the hit
    blocks that sit in the free queue (touching them takes them out of it).

Tokens are known by their origin, not their ids: a request's prompt is a list of *segments*
``(uid, tokens)`` (a shared prefix, its own text, an earlier turn's prompt and answer), and its
output is one more segment, ``("O", request)``. Two requests share a block iff their first
``(j + 1) * block_size`` tokens come from the same segments (:func:`block_keys`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Protocol

from gpu_simulate_test.simulator.types import cdiv

Segments = Sequence[tuple[Hashable, int]]
"""A prompt as the segments it is made of, in order: (what the tokens are, how many)."""


class KVCacheManager(Protocol):
    """What vLLM's scheduler asks of the KV cache, per request ``r`` (an id into the shared
    request arrays)."""

    def lookup(self, r: int, max_tokens: int) -> int:
        """Tokens of ``r`` already cached from its start, within ``max_tokens`` (vLLM's
        ``get_computed_blocks``); remembered for the :meth:`admit` that follows."""
        ...

    def admit(self, r: int, total: int, upto: int) -> bool:
        """A waiting request: the blocks for all its ``total`` tokens so far must be free
        (``scheduler_reserve_full_isl``); if so, take its hit and allocate (and cache) the slots
        for its first ``upto`` tokens. False, changing nothing, when they are not free."""
        ...

    def extend(self, r: int, upto: int) -> bool:
        """A running request grows to ``upto`` tokens (``allocate_slots``); False, changing
        nothing, when the free blocks do not suffice."""
        ...

    def free(self, r: int) -> None:
        """A finished or preempted request's blocks go back to the pool."""
        ...

    def room_for(self, rs: Sequence[int], tokens: Sequence[int], steps: int) -> int:
        """How many of the next ``steps`` decode steps the requests ``rs`` (now at
        ``tokens[r]`` tokens) can take, one token each per step, with no preemption and with
        their :meth:`extend`\\ s made in one call per request at the end to the same effect
        (0: take the steps one by one)."""
        ...

    def usage(self) -> float:
        """The share of usable blocks in use (vLLM's ``get_usage``: 0 to 1)."""
        ...


class CountingKVCache:
    """Prefix caching off: each request holds a count of blocks; nothing is ever hit."""

    __slots__ = ("block_size", "free_blocks", "held", "usable")

    def __init__(self, usable_blocks: int, block_size: int, num_requests: int) -> None:
        self.usable = usable_blocks
        self.free_blocks = usable_blocks
        self.block_size = block_size
        self.held = [0] * num_requests

    def lookup(self, r: int, max_tokens: int) -> int:
        return 0

    def admit(self, r: int, total: int, upto: int) -> bool:
        bs = self.block_size
        if cdiv(total, bs) > self.free_blocks:
            return False
        need = cdiv(upto, bs)
        self.free_blocks -= need
        self.held[r] = need
        return True

    def extend(self, r: int, upto: int) -> bool:
        held = self.held
        need = -(-upto // self.block_size) - held[r]
        if need:  # most decodes fill no new block
            if need > self.free_blocks:
                return False
            self.free_blocks -= need
            held[r] += need
        return True

    def free(self, r: int) -> None:
        self.free_blocks += self.held[r]
        self.held[r] = 0

    def room_for(self, rs: Sequence[int], tokens: Sequence[int], steps: int) -> int:
        """All ``steps`` when the free blocks cover every request's growth (blocks are counted,
        not named: the order they are taken in changes nothing), else 0."""
        bs, held = self.block_size, self.held
        need = 0
        for r in rs:
            need += -(-(tokens[r] + steps) // bs) - held[r]
        return steps if need <= self.free_blocks else 0

    def usage(self) -> float:
        return 1.0 - self.free_blocks / self.usable if self.usable else 0.0


def block_keys(
    prompts: Sequence[Segments], max_out: Sequence[int], block_size: int
) -> list[list[int]]:
    """Per request, one int per full block of its prompt and outputs: equal ints, equal tokens
    up to that block's end (vLLM's chained block hash)."""
    intern: dict[tuple[int, Hashable, int], int] = {}
    out: list[list[int]] = []
    for r, segments in enumerate(prompts):
        keys: list[int] = []
        node = 0  # the prefix before the current segment (0: empty)
        start = 0  # its length in tokens
        for uid, length in [*segments, (("O", r), max_out[r])]:
            if length <= 0:
                continue
            end = start + length
            first = (start // block_size + 1) * block_size  # the first block end inside it
            for e in range(first, end + 1, block_size):
                keys.append(intern.setdefault((node, uid, e - start), len(intern) + 1))
            node = intern.setdefault((node, uid, length), len(intern) + 1)
            start = end
        out.append(keys)
    return out


class PrefixKVCache:
    """vLLM's ``BlockPool`` and a request's blocks (``SingleTypeKVCacheManager``), by block id:
    block 0 is the null block, the free queue starts as ids 1..N-1 in order."""

    __slots__ = (
        "block_size",
        "blocks",
        "cached",
        "free_q",
        "hit",
        "key",
        "keys",
        "n_cached",
        "ref",
    )

    def __init__(self, num_blocks: int, block_size: int, keys: list[list[int]]) -> None:
        self.block_size = block_size
        self.ref = [0] * num_blocks
        self.key: list[int] = [0] * num_blocks  # 0: none
        self.cached: dict[int, list[int]] = {}
        self.free_q: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.keys = keys
        self.blocks: list[list[int]] = [[] for _ in keys]
        self.n_cached = [0] * len(keys)
        self.hit: list[int] = []
        """The blocks the last :meth:`lookup` found."""

    def lookup(self, r: int, max_tokens: int) -> int:
        """The longest run of cached blocks from the request's start, within ``max_tokens``."""
        hit: list[int] = []
        cached = self.cached
        for k in self.keys[r][: max_tokens // self.block_size]:
            ids = cached.get(k)
            if not ids:
                break
            hit.append(ids[0])
        self.hit = hit
        return len(hit) * self.block_size

    def admit(self, r: int, total: int, upto: int) -> bool:
        hit, ref, bs = self.hit, self.ref, self.block_size
        # the whole sequence so far must fit; hit blocks in the free queue count as taken
        evictable = sum(1 for b in hit if ref[b] == 0)
        if cdiv(total, bs) - len(hit) + evictable > len(self.free_q):
            return False
        self._touch(r, hit)
        self._allocate(r, cdiv(upto, bs) - len(hit))
        self._cache(r, min(upto, total))
        return True

    def extend(self, r: int, upto: int) -> bool:
        bs = self.block_size
        need = -(-upto // bs) - len(self.blocks[r])
        if need > len(self.free_q):
            return False
        if need > 0:
            self._allocate(r, need)
        if upto // bs > self.n_cached[r]:  # a block filled: cache it (most decodes fill none)
            self._cache(r, upto)
        return True

    def free(self, r: int) -> None:
        """Tail first: keyed blocks to the free queue's tail, the others to its head."""
        ref, key, free_q = self.ref, self.key, self.free_q
        head: list[int] = []
        for b in reversed(self.blocks[r]):
            ref[b] -= 1
            if ref[b] == 0:
                if key[b]:
                    free_q[b] = None
                else:
                    head.append(b)
        for b in reversed(head):
            free_q[b] = None
            free_q.move_to_end(b, last=False)
        self.blocks[r] = []
        self.n_cached[r] = 0

    def room_for(self, rs: Sequence[int], tokens: Sequence[int], steps: int) -> int:
        """The steps before any request of ``rs`` needs a new block or fills one (which is
        cached when it fills, in the order of the steps): extends in between change nothing."""
        bs, blocks, n_cached = self.block_size, self.blocks, self.n_cached
        for r in rs:
            t = tokens[r]
            steps = min(steps, len(blocks[r]) * bs - t, (n_cached[r] + 1) * bs - 1 - t)
            if steps <= 0:
                return 0
        return steps

    def usage(self) -> float:
        usable = len(self.ref) - 1
        return 1.0 - len(self.free_q) / usable if usable else 0.0

    def cached_blocks(self, r: int, max_tokens: int) -> int:
        """Blocks of request ``r`` a lookup would hit now (for a router's prefix score),
        without remembering them for an admission."""
        kept = self.hit
        hits = self.lookup(r, max_tokens) // self.block_size
        self.hit = kept
        return hits

    def _touch(self, r: int, blocks: list[int]) -> None:
        """A hit: the blocks join the request, leaving the free queue if they were in it."""
        ref, free_q = self.ref, self.free_q
        for b in blocks:
            if ref[b] == 0:
                del free_q[b]
            ref[b] += 1
        self.blocks[r] = list(blocks)
        self.n_cached[r] = len(blocks)

    def _allocate(self, r: int, n: int) -> None:
        """``get_new_blocks``: from the free queue's head, each losing its key."""
        free_q, key, ref, cached, mine = (
            self.free_q,
            self.key,
            self.ref,
            self.cached,
            self.blocks[r],
        )
        for _ in range(n):
            b = free_q.popitem(last=False)[0]
            k = key[b]
            if k:
                ids = cached[k]
                ids.remove(b)
                if not ids:
                    del cached[k]
                key[b] = 0
            ref[b] = 1
            mine.append(b)

    def _cache(self, r: int, num_tokens: int) -> None:
        """``cache_blocks``: the request's full blocks within ``num_tokens`` get their keys."""
        full = num_tokens // self.block_size
        done = self.n_cached[r]
        if done >= full:
            return
        mine, keys, key, cached = self.blocks[r], self.keys[r], self.key, self.cached
        for j in range(done, full):
            b, k = mine[j], keys[j]
            key[b] = k
            ids = cached.get(k)
            if ids is None:
                cached[k] = [b]
            else:
                ids.append(b)
        self.n_cached[r] = full
