"""vLLM 0.32's automatic prefix caching in our V1 scheduler (``backend.enable_prefix_caching``).

What ``vllm/v1/core/kv_cache_manager.py``, ``block_pool.py`` and ``kv_cache_utils.py`` do for one
full-attention group (``specs/prefix_caching.md`` section 1), block for block:

- a request's **full** blocks (prompt and output tokens) are keyed by their whole prefix (vLLM
  chains block hashes; we intern the prefix, so equal keys mean equal tokens, with no collision);
- a new or preempted request hits the longest run of cached blocks from its start, at most
  ``(num_tokens - 1) // block_size`` of them (the last token is always recomputed);
- blocks are cached when they are *scheduled* (``allocate_slots`` -> ``cache_blocks``), so a
  request admitted later in the same step already hits them; a key may map to several blocks,
  the first inserted serving hits;
- freeing a request walks its blocks tail first: those that reach no reference and carry a key
  go to the tail of the free queue (evicted least recently freed first), the others to its head
  (reused first); a block taken from the free queue loses its key (eviction);
- admission asks that the whole sequence fit: the blocks it lacks beyond its hit, plus the hit
  blocks that sit in the free queue (touching them takes them out of it).

Tokens are known by their origin, not their ids: a request's prompt is a list of *segments*
``(uid, tokens)`` (a shared prefix, its own text, an earlier turn's prompt and answer), and its
output is one more segment, ``("O", request)``. Two requests share a block iff their first
``(j + 1) * block_size`` tokens come from the same segments.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence

from gpu_simulate_test.vidur_simulate.v1_engine import V1Engine
from gpu_simulate_test.vidur_simulate.v1_types import Chosen, V1Params, cdiv

Segments = Sequence[tuple[Hashable, int]]
"""A prompt as the segments it is made of, in order: (what the tokens are, how many)."""


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


class BlockPool:
    """vLLM's ``BlockPool`` and a request's blocks (``SingleTypeKVCacheManager``), by block id:
    block 0 is the null block, the free queue starts as ids 1..N-1 in order."""

    __slots__ = ("blocks", "cached", "free_q", "key", "keys", "n_cached", "ref")

    def __init__(self, num_blocks: int, keys: list[list[int]]) -> None:
        self.ref = [0] * num_blocks
        self.key: list[int] = [0] * num_blocks  # 0: none
        self.cached: dict[int, list[int]] = {}
        self.free_q: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.keys = keys
        self.blocks: list[list[int]] = [[] for _ in keys]
        self.n_cached = [0] * len(keys)

    def lookup(self, r: int, max_tokens: int, block_size: int) -> list[int]:
        """The longest run of cached blocks from the request's start, within ``max_tokens``."""
        hit: list[int] = []
        cached = self.cached
        for k in self.keys[r][: max_tokens // block_size]:
            ids = cached.get(k)
            if not ids:
                break
            hit.append(ids[0])
        return hit

    def evictable(self, blocks: list[int]) -> int:
        ref = self.ref
        return sum(1 for b in blocks if ref[b] == 0)

    def touch(self, r: int, blocks: list[int]) -> None:
        """A hit: the blocks join the request, leaving the free queue if they were in it."""
        ref, free_q = self.ref, self.free_q
        for b in blocks:
            if ref[b] == 0:
                del free_q[b]
            ref[b] += 1
        self.blocks[r] = list(blocks)
        self.n_cached[r] = len(blocks)

    def allocate(self, r: int, n: int) -> None:
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

    def cache(self, r: int, num_tokens: int, block_size: int) -> None:
        """``cache_blocks``: the request's full blocks within ``num_tokens`` get their keys."""
        full = num_tokens // block_size
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

    def free(self, r: int) -> None:
        """A finished or preempted request's blocks, tail first: keyed ones to the free queue's
        tail, the others to its head."""
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


class CachingV1Engine(V1Engine):
    """:class:`.v1_engine.V1Engine` with the blocks named and cached (:class:`BlockPool`)."""

    __slots__ = ("cached_tokens", "pool", "stats")

    def __init__(
        self,
        params: V1Params,
        arr: list[float],
        prompt: list[int],
        max_out: list[int],
        keys: list[list[int]],
    ) -> None:
        super().__init__(params, arr, prompt, max_out)
        self.pool = BlockPool(params.num_blocks, keys)
        self.cached_tokens = [-1] * len(arr)
        """Tokens served from the cache at the request's first admission (vLLM's
        ``num_cached_tokens``; -1: never admitted)."""
        self.stats = {"queries": 0, "hits": 0, "preempted_queries": 0, "preempted_hits": 0}
        """vLLM's ``PrefixCacheStats`` totals, in tokens."""

    def release(self, r: int) -> None:
        self.pool.free(r)

    def _schedule_running(self, budget: int, limit: int, chosen: Chosen) -> tuple[int, int]:
        running, waiting, prompt, outputs = self.running, self.waiting, self.prompt, self.outputs
        computed, restarts, pool = self.computed, self.restarts, self.pool
        blocks, free_q, bs, n_cached = (
            pool.blocks,
            pool.free_q,
            self.params.block_size,
            pool.n_cached,
        )
        preempted = 0
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            total = prompt[r] + outputs[r]
            new = total - computed[r]
            if 0 < limit < new:
                new = limit
            new = min(new, budget)
            if new <= 0:
                i += 1
                continue
            fits = True
            upto = computed[r] + new  # never past ``total``
            while True:
                need = -(-upto // bs) - len(blocks[r])
                if need <= len(free_q):
                    break
                victim = running.pop()
                pool.free(victim)
                computed[victim] = 0
                restarts[victim] += 1
                preempted += 1
                waiting.appendleft(victim)
                if victim == r:
                    fits = False
                    break
            if not fits:
                break
            if need > 0:
                pool.allocate(r, need)
            if upto // bs > n_cached[r]:  # a block filled: cache it (most decodes fill none)
                pool.cache(r, upto, bs)
            chosen.append((r, new, outputs[r] == 0))
            budget -= new
            i += 1
        return budget, preempted

    def _schedule_waiting(self, budget: int, limit: int, chosen: Chosen) -> None:
        running, waiting, prompt, outputs = self.running, self.waiting, self.prompt, self.outputs
        params, pool, computed, stats = self.params, self.pool, self.computed, self.stats
        bs, seqs = params.block_size, params.max_num_seqs
        while budget > 0 and waiting and len(running) < seqs:
            r = waiting[0]
            total = prompt[r] + outputs[r]
            hit_blocks = pool.lookup(r, total - 1, bs)
            hit = len(hit_blocks) * bs
            new = total - hit
            if 0 < limit < new:
                new = limit
            if not params.enable_chunked_prefill and new > budget:
                break
            new = min(new, budget)
            # the whole sequence so far must fit; hit blocks in the free queue count as taken
            lacking = cdiv(total, bs) - len(hit_blocks) + pool.evictable(hit_blocks)
            if lacking > len(pool.free_q):
                break
            pool.touch(r, hit_blocks)
            pool.allocate(r, cdiv(hit + new, bs) - len(hit_blocks))
            pool.cache(r, min(hit + new, total), bs)
            if self.restarts[r]:
                stats["preempted_queries"] += total
                stats["preempted_hits"] += hit
            else:
                stats["queries"] += total
                stats["hits"] += hit
                self.cached_tokens[r] = hit
            computed[r] = hit
            waiting.popleft()
            running.append(r)
            chosen.append((r, new, outputs[r] == 0))
            budget -= new
